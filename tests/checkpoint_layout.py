"""How a checkpoint's tensors land in its shard files, so a card's synthesized tensor list can be checked against
the file sizes and header digests published for the real checkpoint (tests/fixtures/models/*/published-shards.json).

Hugging Face's `save_pretrained` walks the model's state dict in module registration order and starts a new shard
when the next tensor would take the current one past `max_shard_size` (huggingface_hub
`split_torch_state_dict_into_shards`). safetensors writes each shard as an 8-byte little-endian header length, a
JSON header (`__metadata__`, then one entry per tensor in data order) padded with spaces to a multiple of 8, and
the data. The tests only claim this for the checkpoints whose published figures it reproduces byte for byte.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from review.model_card import Tensors, _bytes

QWEN3_MAX_SHARD_SIZE = 4 * 10**9
"""Qwen's checkpoints were saved with `max_shard_size="4GB"` (4 x 10^9 bytes): the first Qwen3-8B shard ends at
3,996,241,408 bytes of tensors because layer 7's o_proj (33,554,432) would take it past that."""
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
"""transformers' default `max_shard_size="5GB"`, which Llama 3.1 8B Instruct (transformers 4.42.3) and Devstral Small
2507 (4.53.1) were saved with: their first shards end at 4,976,689,152 and 4,781,568,000 bytes of tensors."""

_LAYER_SLOTS = ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.", "self_attn.o_proj.",
                "self_attn.q_norm.", "self_attn.k_norm.", "mlp.gate.", "mlp.experts.", "mlp.gate_proj.",
                "mlp.up_proj.", "mlp.down_proj.", "input_layernorm.", "post_attention_layernorm.")
"""A decoder layer's parameters in registration order (transformers' Qwen3DecoderLayer: self_attn q, k, v, o, q_norm,
k_norm; mlp: the router `gate` before the `experts` list, or gate/up/down of a dense MLP; then the two norms).
LlamaDecoderLayer and MistralDecoderLayer register the same modules without q_norm / k_norm."""
_EXPERT_SLOTS = ("gate_proj.", "up_proj.", "down_proj.")
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(.+)")
_TOP = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def _slot(rest: str, slots: tuple[str, ...], name: str) -> int:
    for i, prefix in enumerate(slots):
        if rest.startswith(prefix):
            return i
    raise ValueError(f"{name}: not a Qwen3 / Llama / Mistral checkpoint tensor")


def save_order(names: list[str]) -> list[str]:
    """The tensors in the order `save_pretrained` meets them in a Qwen3 / Qwen3-MoE / Llama / Mistral state dict: the
    embedding, every decoder layer (experts by index, each gate/up/down), the final norm, the LM head."""
    def key(name: str) -> tuple[int, ...]:
        layer = _LAYER.fullmatch(name)
        if not layer:
            if name not in _TOP:
                raise ValueError(f"{name}: not a Qwen3 / Llama / Mistral checkpoint tensor")
            return (0,) if name == _TOP[0] else (2, _TOP.index(name))
        rest = layer.group(2)
        expert = _EXPERT.fullmatch(rest)
        inner = (int(expert.group(1)), _slot(expert.group(2), _EXPERT_SLOTS, name)) if expert else (0, 0)
        return (1, int(layer.group(1)), _slot(rest, _LAYER_SLOTS, name), *inner)
    return sorted(names, key=key)


def shard_names(order: list[str], sizes: dict[str, int], max_shard_size: int) -> list[list[str]]:
    """huggingface_hub's greedy split: a new shard when the next tensor would pass `max_shard_size`."""
    shards: list[list[str]] = []
    current: list[str] = []
    filled = 0
    for name in order:
        if current and filled + sizes[name] > max_shard_size:
            shards.append(current)
            current, filled = [], 0
        current.append(name)
        filled += sizes[name]
    return [*shards, current]


def index_json(metadata: dict[str, int], shards: list[list[str]]) -> bytes:
    """The `model.safetensors.index.json` bytes `save_pretrained` writes for these shards (`json.dumps(indent=2,
    sort_keys=True)` and a newline; files named model-0000i-of-0000n.safetensors)."""
    weight_map = {name: f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                  for i, names in enumerate(shards) for name in names}
    return (json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n").encode()


def _entry(name: str, dtype: str, shape: list[int], start: int, end: int) -> str:
    return (f'{json.dumps(name)}:{{"dtype":"{dtype}","shape":[{",".join(map(str, shape))}],'
            f'"data_offsets":[{start},{end}]}}')


def safetensors_header(tensors: Tensors, names: list[str]) -> bytes:
    """The header bytes safetensors writes for a shard of `names` (all of one dtype: data in name order), after the
    8-byte length: compact JSON with `{"format":"pt"}` metadata, space-padded to a multiple of 8."""
    dtypes = {tensors[n][0] for n in names}
    if len(dtypes) != 1:
        raise ValueError(f"mixed dtypes {sorted(dtypes)}: the data order is not the name order")
    entries = ['"__metadata__":{"format":"pt"}']
    offset = 0
    for name in sorted(names):
        dtype, shape = tensors[name]
        size = _bytes(dtype, shape)
        entries.append(_entry(name, dtype, shape, offset, offset + size))
        offset += size
    raw = ("{" + ",".join(entries) + "}").encode()
    return raw + b" " * (-len(raw) % 8)


def header_bounds(tensors: Tensors, shards: int) -> tuple[int, int]:
    """Fewest and most bytes `shards` files holding `tensors` spend outside the tensor data, however the tensors are
    spread and ordered: per file the 8-byte length, `{}` or the `format` metadata and up to 7 bytes of padding; per
    tensor its header entry with two data offsets of 1 to 11 digits each (no shard reaches 100 GB)."""
    fixed = sum(len(_entry(n, d, s, 0, 0)) - 2 + 1 for n, (d, s) in tensors.items())  # entry without digits, comma
    least = fixed + 2 * len(tensors) + shards * (8 + len("{}") - 1)  # a header's first entry has no comma
    most = fixed + 22 * len(tensors) + shards * (8 + len('{"__metadata__":{"format":"pt"}}') + 7)
    return least, most


def published(path: Path) -> dict[str, Any]:
    """A published-shards.json fixture (its origin is recorded inside and in ORIGINS.md)."""
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data
