"""`python -m stacks model-card SRC --name NAME`: a model card from the model's own files.

Reads `config.json` (the language model under `text_config` when nested) and the weights' tensor list: the
`model.safetensors.index.json` plus every shard's safetensors header, or the header of a single
`model.safetensors`. SRC is a local model directory, `s3://bucket/prefix` (the sync's own source rule and client,
checks/weights.py; a shard's header is two ranged GETs) or `hf://ORG/NAME[@REVISION]` (the Hugging Face Hub, the same
ranged GETs: review/hf_source.py). `--synthesize-weights` builds the tensor list from
config.json instead, with the names and dtypes the architecture's checkpoints use, for a directory that holds only
the config (and maybe the index, whose names must then match); the card says "synthesized" for those bytes.
Facts that are not in the model's files (parsers, a vision tower's default, an assumed weight split) come from
`--fact KEY=VALUE` and are recorded as given on the command line.

Writes `models/NAME.json` under the project root (`VLLM_CLUSTER_ROOT` when set). Every fact carries where it came
from (file and key). Missing or contradictory facts exit 2 naming the file and key.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, TypeAdapter, ValidationError

from review.card_sources import CardError, LocalSource, S3Source, Source
from review.loader_rules import LoaderRefusal, check_header, quantization_config, quantization_method
from stacks.model.field_types import ParserName
from stacks.model.masking import mask_secrets
from stacks.model.project import escapes, not_a_project
from stacks.planner.memory import EMBEDDING, classify
from stacks.planner.model_cards import (
    CARD_VERSION,
    FAMILIES,
    SHIPPED,
    THINKING_KWARGS,
    CardProblem,
    card_path,
    profile_from_card,
)

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I64": 8,
               "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5}
TORCH_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "half": "F16", "float": "F32"}
MAX_HEADER = 100_000_000
_MTP_SOURCE = "layers past num_hidden_layers (multi-token prediction) are loaded only with MTP speculative decoding"
FACT_KEYS = {
    "tokenizer_mode": str, "tool_call_parser": str, "reasoning_parser": str, "default_kv_cache_dtype": str,
    "vision": bool, "supports_pp": bool, "draft_supports_pp": dict, "min_vram_gb": float,
    "engram_hash_heads": int, "weights_split_gb": dict, "routed_experts": int, "thinking_kwarg": str,
}
"""What `--fact` may set: serving defaults the model files do not hold, and (for checkpoints whose files are
not available) facts the card must otherwise assume."""


def open_source(src: str, endpoint_url: str | None = None, region: str | None = None) -> Source:
    if src.startswith("hf://"):
        from review.hf_source import HubSource

        for flag, value in (("--endpoint-url", endpoint_url), ("--region", region)):
            if value is not None:
                raise CardError(f"{flag} is for s3:// sources; an hf:// source reads the Hub at HF_ENDPOINT "
                                "(https://huggingface.co when unset)")
        return HubSource(src)
    if src.startswith("s3://"):
        return S3Source(src, endpoint_url, region)
    if (scheme := re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", src)) is not None:  # not a folder: Path() folds `//`
        raise CardError(f"SRC {ascii(mask_secrets(src))[:300]}: a {scheme.group(1)}: URL, which model-card does not "
                        "read; SRC is a local model directory, s3://bucket/prefix or hf://ORG/NAME[@REVISION]")
    return LocalSource(Path(src))


# ------------------------------------------------------------------------------------------------ config


@dataclass
class Facts:
    """Values read from config.json with their origin, or refused with the file and key."""

    cfg: dict[str, Any]
    sources: dict[str, str]
    file: str = "config.json"

    def get(self, fact: str, *keys: str, kind: type = int, required: bool = True, lo: float = 1,
            hi: float = 1e9, default: Any = None) -> Any:
        for key in keys:
            if key in self.cfg and self.cfg[key] is not None:
                value = self.cfg[key]
                if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)
                                             or (kind is int and isinstance(value, float)
                                                 and not value.is_integer())):
                    what = "an integer" if kind is int else "a number"
                    raise CardError(f"{self.file}: {key} = {value!r} is not {what}")
                if kind in (int, float) and not lo <= value <= hi:  # ints compared exactly: 10**400 is no float
                    shown = value if len(str(value)) <= 40 else f"{str(value)[:20]}… ({len(str(value))} digits)"
                    raise CardError(f"{self.file}: {key} = {shown} is not plausible (expected {lo:g}..{hi:g})")
                if kind is str and not isinstance(value, str):
                    raise CardError(f"{self.file}: {key} = {value!r} is not a string")
                self.sources[fact] = f"{self.file}: {key}"
                return kind(value) if kind in (int, float) else value
        if required and default is None:
            raise CardError(f"{self.file}: none of {', '.join(keys)} is set; the card needs {fact}")
        if default is not None:
            self.sources[fact] = f"default ({default!r}; {self.file} has no {' / '.join(keys)})"
        return default


def read_config(source: Source) -> tuple[dict[str, Any], dict[str, Any]]:
    """(raw config.json, the language model's config: `text_config` merged over the top level)."""
    if not source.exists("config.json"):
        raise CardError(f"{source.label}: no config.json (a Hugging Face model directory holds config.json next "
                        "to its *.safetensors)")
    try:
        raw = json.loads(source.read("config.json"))
    except RecursionError:
        raise CardError(f"{source.label}/config.json: nested too deeply to be a model config") from None
    except ValueError as exc:
        raise CardError(f"{source.label}/config.json: not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise CardError(f"{source.label}/config.json: not a JSON object")
    nested = raw.get("text_config")
    return raw, ({**raw, **nested} if isinstance(nested, dict) else dict(raw))


def family_of(cfg: dict[str, Any], mla: bool, moe: bool) -> str:
    if "compress_rates" in cfg or "o_groups" in cfg:
        return "deepseek-v4"
    if mla:
        return "moe-mla" if moe else "dense-mla"
    if cfg.get("model_type") == "gpt_oss":
        return "moe-gqa"
    return "moe-gqa" if moe else "dense-gqa"


def model_facts(raw: dict[str, Any], cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Every architecture fact the rules need, and its origin."""
    sources: dict[str, str] = {}
    f = Facts(cfg, sources)
    arches = raw.get("architectures")
    if not isinstance(arches, list) or not arches or not all(isinstance(a, str) for a in arches):
        raise CardError("config.json: architectures must be a list of class names (e.g. [\"Qwen3ForCausalLM\"])")
    for i, arch in enumerate(arches):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", arch):  # no control, bidi or other look-alike text
            raise CardError(f"config.json: architectures[{i}] = {arch!a} is not a class name (letters, digits "
                            "and _, e.g. Qwen3ForCausalLM)")
    sources["architecture"] = "config.json: architectures[0]"
    facts: dict[str, Any] = {"architecture": arches[0], "model_type": raw.get("model_type")}
    facts["layers"] = f.get("layers", "num_hidden_layers", hi=10_000)
    facts["attention_heads"] = heads = f.get("attention_heads", "num_attention_heads", hi=100_000)
    facts["hidden_size"] = hidden = f.get("hidden_size", "hidden_size", hi=1_000_000, required=False)
    facts["vocab_size"] = f.get("vocab_size", "vocab_size", hi=100_000_000, required=False)
    kv_lora = f.get("kv_lora_rank", "kv_lora_rank", required=False)
    mla = kv_lora is not None
    if mla:
        facts["mla"] = {
            "kv_lora_rank": kv_lora,
            "qk_rope_head_dim": f.get("qk_rope_head_dim", "qk_rope_head_dim", hi=100_000),
            "qk_nope_head_dim": f.get("qk_nope_head_dim", "qk_nope_head_dim", hi=100_000),
            "v_head_dim": f.get("v_head_dim", "v_head_dim", hi=100_000),
            "q_lora_rank": f.get("q_lora_rank", "q_lora_rank", required=False),
        }
        facts["kv_heads"] = 1
        sources["kv_heads"] = "MLA: one latent KV head per layer (vLLM config/model.py:1673-1675)"
        facts["head_dim"] = kv_lora + facts["mla"]["qk_rope_head_dim"]
        sources["head_dim"] = "kv_lora_rank + qk_rope_head_dim (vLLM's MLA head size)"
    else:
        facts["mla"] = None
        kv = f.get("kv_heads", "num_key_value_heads", required=False, hi=100_000)
        if kv is None:
            kv = heads
            sources["kv_heads"] = "num_attention_heads (config.json has no num_key_value_heads: multi-head)"
        if kv > heads or heads % kv:
            raise CardError(f"config.json: num_key_value_heads = {kv} contradicts num_attention_heads = {heads} "
                            "(the attention heads must be a whole multiple of the KV heads)")
        facts["kv_heads"] = kv
        head_dim = f.get("head_dim", "head_dim", required=False, hi=100_000)
        if head_dim is None:
            if hidden is None:
                raise CardError("config.json: neither head_dim nor hidden_size is set; the card needs head_dim")
            if hidden % heads:
                raise CardError(f"config.json: head_dim is not set and hidden_size {hidden} is not a multiple of "
                                f"num_attention_heads {heads}")
            head_dim = hidden // heads
            sources["head_dim"] = "config.json: hidden_size / num_attention_heads"
        facts["head_dim"] = head_dim
    routed = f.get("routed_experts", "n_routed_experts", "num_experts", "num_local_experts", required=False,
                   hi=1_000_000)
    if routed:
        active = f.get("active_experts", "num_experts_per_tok", "experts_per_token", hi=1_000_000)
        if active > routed:
            raise CardError(f"config.json: num_experts_per_tok = {active} contradicts {routed} routed experts")
        facts["moe"] = {
            "routed_experts": routed, "active_experts": active,
            "shared_experts": f.get("shared_experts", "n_shared_experts", "num_shared_experts", required=False,
                                    lo=0) or 0,
            "expert_ffn_size": f.get("expert_ffn_size", "moe_intermediate_size", "intermediate_size",
                                     hi=10_000_000),
            "first_dense_layers": f.get("first_dense_layers", "first_k_dense_replace", required=False, lo=0) or 0,
        }
    else:
        facts["moe"] = None
    facts["ffn_size"] = f.get("ffn_size", "intermediate_size", required=False, hi=10_000_000)
    facts["max_position_embeddings"] = f.get("max_position_embeddings", "max_position_embeddings",
                                             hi=1e9)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    facts["rope_scaling"] = rope if isinstance(rope, dict) else None
    factor = facts["rope_scaling"].get("factor") if facts["rope_scaling"] else None
    rope_key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float)
                               or not 0 < factor <= 10_000):  # NaN and Infinity fail too (json reads both)
        raise CardError(f"config.json: {rope_key}.factor = {factor!r} is not a rope scaling factor (a finite "
                        "number above 0, at most 10000)")
    if facts["rope_scaling"]:
        sources["rope_scaling"] = "config.json: rope_scaling" if cfg.get("rope_scaling") else \
            "config.json: rope_parameters"
    facts["max_model_len"] = derived_max_len(facts["max_position_embeddings"], facts["rope_scaling"])
    sources["max_model_len"] = ("max_position_embeddings x the rope factor unless the rope type already scales it "
                                "(vLLM config/model.py:2545-2685, _get_and_verify_max_len)")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    sources["dtype"] = "config.json: torch_dtype" if cfg.get("torch_dtype") else (
        "config.json: dtype" if cfg.get("dtype") else "default bfloat16 (config.json names no dtype)")
    if dtype not in TORCH_DTYPE:
        raise CardError(f"config.json: torch_dtype = {dtype!r} is not one of {sorted(TORCH_DTYPE)}")
    facts["dtype"] = dtype
    quant, found = quantization_config(raw)  # where vLLM looks, in its order
    if quant is not None and not isinstance(quant, dict):
        raise CardError(f"{found} is not a JSON object")
    if quant is not None:
        try:
            method = quantization_method(quant)
        except ValueError as exc:
            raise CardError(f"{found}: {exc}") from None
        block = quant.get("weight_block_size")
        if block is not None and not (isinstance(block, list) and len(block) == 2 and all(
                isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 65536 for b in block)):
            raise CardError(f"{found}.weight_block_size = {block!r}: not an FP8 block (two whole numbers from 1 to "
                            "65536, e.g. [128, 128]); vLLM divides every weight by it")
        facts["quantization"] = {"method": method, "format": quant.get("fmt"), "block_size": block,
                                 "modules_not_converted": quant.get("modules_to_not_convert")}
        sources["quantization"] = found
    else:
        facts["quantization"] = None
    facts["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    facts["attention_bias"] = bool(cfg.get("attention_bias", False))
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    use_window = cfg.get("use_sliding_window", True) is not False and isinstance(window, int)
    if use_window and isinstance(window, int) and (isinstance(window, bool) or window < 1):
        raise CardError(f"config.json: sliding_window = {window!r}: not a window (at least 1 token; null or "
                        "use_sliding_window: false for none)")
    facts["sliding_window"] = window if use_window else None
    facts["layer_types"] = types if isinstance(types, list) else None
    if isinstance(types, list) and len(types) < facts["layers"]:
        raise CardError(f"config.json: layer_types lists {len(types)} layers, num_hidden_layers is {facts['layers']}")
    facts["mtp_layers"] = f.get("mtp_layers", "num_nextn_predict_layers", required=False, lo=0) or 0
    facts["family"] = family_of(cfg, mla, bool(routed))
    if facts["family"] == "deepseek-v4":
        rates = cfg.get("compress_rates")
        if not isinstance(types, list) or not isinstance(rates, dict):
            raise CardError("config.json: layer_types and compress_rates are needed for compressed attention")
        facts["kv_ratios"] = [max(1, int(rates.get(t, 0) or 0)) for t in types[:facts["layers"]]]
        sources["kv_ratios"] = "config.json: layer_types x compress_rates"
        facts["o_groups"] = f.get("o_groups", "o_groups", required=False)
    facts["vision"] = isinstance(raw.get("vision_config"), dict)
    sources["vision"] = "config.json: vision_config" if facts["vision"] else "config.json has no vision_config"
    return facts, sources


def derived_max_len(max_pos: int, rope: dict[str, Any] | None) -> int:
    """vLLM 0.33.0's derived max_model_len: the rope factor multiplies max_position_embeddings except for
    the types that leave it already scaled (config/model.py:2545-2685)."""
    if not rope:
        return max_pos
    kind = rope.get("rope_type") or rope.get("type") or "default"
    factor = rope.get("factor")
    if kind in ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "default") \
            or not isinstance(factor, int | float):
        return max_pos
    return int(max_pos * factor)


# ------------------------------------------------------------------------------------------------ tensors


Tensors = dict[str, tuple[str, list[int]]]


def _bytes(dtype: str, shape: list[int]) -> int:
    return math.ceil(math.prod(shape) * DTYPE_BYTES[dtype])


SYNTHESIZABLE = ("DeepseekV3ForCausalLM", "GptOssForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                 "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
"""The architectures whose checkpoint names and dtypes `synthesize` writes (each checked against a published
checkpoint in tests/test_model_cards.py and tests/test_hf_cards.py); another would get these names silently wrong."""


def synthesize(facts: dict[str, Any]) -> Tensors:
    """The checkpoint's tensors as Hugging Face writes them for this architecture (names, dtypes, shapes)."""
    if facts["architecture"] not in SYNTHESIZABLE:
        raise CardError(f"config.json: architectures[0] = {facts['architecture']}: --synthesize-weights knows the "
                        f"tensor names of {', '.join(SYNTHESIZABLE)} only; read the real shard headers instead "
                        "(the index and the *.safetensors files, or model.safetensors, beside config.json)")
    t: Tensors = {}
    for key in ("hidden_size", "vocab_size"):
        if not facts[key]:
            raise CardError(f"config.json: {key} is needed to build the tensor list (--synthesize-weights)")
    base = TORCH_DTYPE[facts["dtype"]]
    quant = facts["quantization"] or {}
    fp8 = quant.get("method") == "fp8"
    block = quant.get("block_size") or [128, 128]
    h, v, heads, kv, hd = (facts["hidden_size"], facts["vocab_size"], facts["attention_heads"], facts["kv_heads"],
                           facts["head_dim"])

    def linear(name: str, out: int, inp: int, bias: bool = False) -> None:
        if fp8:
            t[f"{name}.weight"] = ("F8_E4M3", [out, inp])
            t[f"{name}.weight_scale_inv"] = ("F32", [math.ceil(out / block[0]), math.ceil(inp / block[1])])
        else:
            t[f"{name}.weight"] = (base, [out, inp])
        if bias:
            t[f"{name}.bias"] = (base, [out])

    t["model.embed_tokens.weight"] = (base, [v, h])
    t["model.norm.weight"] = (base, [h])
    if not facts["tie_word_embeddings"]:
        t["lm_head.weight"] = (base, [v, h])
    moe, mla = facts["moe"], facts["mla"]
    gpt_oss = facts["model_type"] == "gpt_oss"
    for i in range(facts["layers"] + facts["mtp_layers"]):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = (base, [h])
        t[f"{p}.post_attention_layernorm.weight"] = (base, [h])
        a = f"{p}.self_attn"
        if mla:
            rope, nope, vdim, ql = mla["qk_rope_head_dim"], mla["qk_nope_head_dim"], mla["v_head_dim"], \
                mla["q_lora_rank"]
            if ql:
                linear(f"{a}.q_a_proj", ql, h)
                t[f"{a}.q_a_layernorm.weight"] = (base, [ql])
                linear(f"{a}.q_b_proj", heads * (nope + rope), ql)
            else:
                linear(f"{a}.q_proj", heads * (nope + rope), h)
            linear(f"{a}.kv_a_proj_with_mqa", mla["kv_lora_rank"] + rope, h)
            t[f"{a}.kv_a_layernorm.weight"] = (base, [mla["kv_lora_rank"]])
            linear(f"{a}.kv_b_proj", heads * (nope + vdim), mla["kv_lora_rank"])
            linear(f"{a}.o_proj", h, heads * vdim)
        else:
            bias = facts["attention_bias"]
            qkv_bias = bias or facts["model_type"] == "qwen2"  # vLLM qwen2.py:156-170: bias on q/k/v, none on o
            linear(f"{a}.q_proj", heads * hd, h, qkv_bias)
            linear(f"{a}.k_proj", kv * hd, h, qkv_bias)
            linear(f"{a}.v_proj", kv * hd, h, qkv_bias)
            linear(f"{a}.o_proj", h, heads * hd, bias)
            if facts["model_type"] in ("qwen3", "qwen3_moe"):
                t[f"{a}.q_norm.weight"] = (base, [hd])
                t[f"{a}.k_norm.weight"] = (base, [hd])
            if gpt_oss:
                t[f"{a}.sinks"] = (base, [heads])
        m = f"{p}.mlp"
        if moe and i >= moe["first_dense_layers"]:
            e, ie = moe["routed_experts"], moe["expert_ffn_size"]
            if gpt_oss:  # MXFP4: 32 values per scale byte, two values per byte (mxfp4.py:200-290)
                t[f"{m}.router.weight"] = (base, [e, h])
                t[f"{m}.router.bias"] = (base, [e])
                t[f"{m}.experts.gate_up_proj_blocks"] = ("U8", [e, 2 * ie, h // 32, 16])
                t[f"{m}.experts.gate_up_proj_scales"] = ("U8", [e, 2 * ie, h // 32])
                t[f"{m}.experts.gate_up_proj_bias"] = (base, [e, 2 * ie])
                t[f"{m}.experts.down_proj_blocks"] = ("U8", [e, h, ie // 32, 16])
                t[f"{m}.experts.down_proj_scales"] = ("U8", [e, h, ie // 32])
                t[f"{m}.experts.down_proj_bias"] = (base, [e, h])
                continue
            if facts["model_type"] == "mixtral":  # block_sparse_moe.gate + experts.N.w1/w2/w3 (mixtral.py:111-131)
                b = f"{p}.block_sparse_moe"
                t[f"{b}.gate.weight"] = (base, [e, h])
                for x in range(e):
                    linear(f"{b}.experts.{x}.w1", ie, h)
                    linear(f"{b}.experts.{x}.w2", h, ie)
                    linear(f"{b}.experts.{x}.w3", ie, h)
                continue
            t[f"{m}.gate.weight"] = (base, [e, h])
            if mla:
                t[f"{m}.gate.e_score_correction_bias"] = ("F32", [e])
            for x in range(e):
                linear(f"{m}.experts.{x}.gate_proj", ie, h)
                linear(f"{m}.experts.{x}.up_proj", ie, h)
                linear(f"{m}.experts.{x}.down_proj", h, ie)
            if moe["shared_experts"]:
                s = moe["shared_experts"] * ie
                linear(f"{m}.shared_experts.gate_proj", s, h)
                linear(f"{m}.shared_experts.up_proj", s, h)
                linear(f"{m}.shared_experts.down_proj", h, s)
        else:
            ffn = facts["ffn_size"]
            if not ffn:
                raise CardError("config.json: intermediate_size is needed for the dense MLP layers")
            linear(f"{m}.gate_proj", ffn, h)
            linear(f"{m}.up_proj", ffn, h)
            linear(f"{m}.down_proj", h, ffn)
        if i >= facts["layers"]:  # DeepSeek's multi-token-prediction layer
            t[f"{p}.enorm.weight"] = (base, [h])
            t[f"{p}.hnorm.weight"] = (base, [h])
            t[f"{p}.eh_proj.weight"] = (base, [h, 2 * h])
            t[f"{p}.shared_head.norm.weight"] = (base, [h])
            t[f"{p}.shared_head.head.weight"] = (base, [v, h])
            t[f"{p}.embed_tokens.weight"] = (base, [v, h])
    return t


def parse_header(data: bytes, where: str, file_size: int | None
                 ) -> tuple[dict[str, int], dict[str, str], dict[str, list[int]]]:
    """Bytes, dtype and shape of every tensor in one safetensors header."""
    try:
        header = json.loads(data)
    except RecursionError:
        raise CardError(f"{where}: the safetensors header is nested too deeply to be one") from None
    except ValueError as exc:
        raise CardError(f"{where}: the safetensors header is not JSON ({exc}): truncated or not a safetensors file") \
            from exc
    if not isinstance(header, dict):
        raise CardError(f"{where}: the safetensors header is not a JSON object")
    tensors: dict[str, tuple[int, int, str, list[int]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in info["data_offsets"])
            dtype, shape = str(info["dtype"]), info["shape"]
            if not isinstance(shape, list) or any(isinstance(x, bool) or not isinstance(x, int) or x.bit_length() > 63
                                                  for x in shape):
                raise ValueError("shape is not a list of 64-bit integers")
        except (KeyError, TypeError, ValueError) as exc:
            raise CardError(f"{where}: tensor {name[:80]!r}: no dtype/shape/data_offsets ({str(exc)[:120]})") from exc
        tensors[name] = (start, end, dtype, shape)
    try:  # what the safetensors loader refuses is refused here: no card for a checkpoint vLLM cannot open
        check_header(tensors, None if file_size is None else file_size - 8 - len(data))
    except LoaderRefusal as exc:
        raise CardError(f"{where}: {exc} (the safetensors loader refuses this file)") from None
    sizes = {name: end - start for name, (start, end, _, _) in tensors.items()}
    return sizes, {n: t[2] for n, t in tensors.items()}, {n: t[3] for n, t in tensors.items()}


def read_shard(source: Source, shard: str) -> tuple[dict[str, int], dict[str, str], int, dict[str, list[int]]]:
    """One shard's header (two reads: its length, then the JSON) and its file size when known."""
    if not source.exists(shard):
        raise CardError(f"model.safetensors.index.json: weight_map names {shard}, which {source.label} does not "
                        "hold (an incomplete upload or copy)")
    head = source.read_range(shard, 0, 8)
    if len(head) != 8:
        raise CardError(f"{shard}: shorter than the 8-byte safetensors header length")
    (length,) = struct.unpack("<Q", head)
    if not 2 <= length <= MAX_HEADER:
        raise CardError(f"{shard}: header length {length} is not plausible")
    data = source.read_range(shard, 8, length)
    if len(data) != length:
        raise CardError(f"{shard}: the header is cut short ({len(data)} of {length} bytes)")
    size = source.size(shard)
    sizes, dtypes, shapes = parse_header(data, shard, size)
    return sizes, dtypes, size if size is not None else 8 + length + sum(sizes.values()), shapes


def no_shards(source: Source, name: str, index: dict[str, Any]) -> str:
    """Why a folder with config.json and the index but no shard at all gives no card, and the two ways that do: the
    tensor list built from config.json, or the real headers read from the Hub without the weights."""
    shards = sorted(set(index["weight_map"].values()))
    hub = "" if source.label.startswith("hf://") else (
        ", or read the real shard headers from the Hugging Face Hub without downloading the weights: "
        f"model-card hf://ORG/NAME[@REVISION] --name {name} (HF_TOKEN for a gated or private model)")
    return (f"{source.label} holds config.json and model.safetensors.index.json but none of the {len(shards)} shard "
            f"files the index names ({shards[0]}{', …' if len(shards) > 1 else ''}): build the tensor list from "
            f"config.json with --synthesize-weights (its names are checked against the index){hub}")


def read_index(source: Source) -> dict[str, Any] | None:
    name = "model.safetensors.index.json"
    if not source.exists(name):
        return None
    try:
        index = json.loads(source.read(name))
    except RecursionError:
        raise CardError(f"{name}: nested too deeply to be a safetensors index") from None
    except ValueError as exc:
        raise CardError(f"{name}: not JSON ({exc}): truncated?") from exc
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
        raise CardError(f"{name}: weight_map is missing or empty")
    total = (index.get("metadata") or {}).get("total_size")
    if total is not None and (not isinstance(total, int) or total < 0):
        raise CardError(f"{name}: metadata.total_size = {total!r} is not a byte count")
    for shard in set(wmap.values()):
        if "/" in shard or not shard.endswith(".safetensors"):
            raise CardError(f"{name}: weight_map names {shard!r}, not a .safetensors file beside the index")
    return dict(index)


# ------------------------------------------------------------------------------------------------ consistency


_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_NOT_DECODER = re.compile(r"(^|\.)(vision\w*|visual|audio\w*|mm_projector|multi_modal_projector)\.")
_EXPERT = re.compile(r"(^|\.)layers\.(\d+)\.(mlp|block_sparse_moe|feed_forward)\.experts\.(\d+)\.")
_FUSED_EXPERTS = re.compile(r"(^|\.)layers\.(\d+)\.(mlp|block_sparse_moe|feed_forward)\.experts\."
                            r"(gate_up_proj|down_proj)(_blocks|_scales)?$")
_EMBED = re.compile(r"(^|\.)(embed_tokens|wte|tok_embeddings|word_embeddings)\.weight$")
_FLOAT = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
"""Dtypes whose first dimension is a linear layer's output rows (packed formats, e.g. bitsandbytes' U8, are not)."""


def _key(sources: dict[str, str], fact: str) -> str:
    """The config.json key a fact came from, as the error names it."""
    where = sources.get(fact, fact)
    return where.split(": ", 1)[1] if where.startswith("config.json: ") else where


def _spans(values: list[int]) -> str:
    out: list[str] = []
    for v in values:
        if out and out[-1].split("..")[-1] == str(v - 1):
            out[-1] = f"{out[-1].split('..')[0]}..{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def check_tensors(facts: dict[str, Any], sources: dict[str, str], files: dict[str, str],
                  shapes: dict[str, tuple[str, list[int]]] | None) -> None:
    """config.json against the checkpoint's own tensors: every decoder layer 0..L-1 holds tensors and none lies
    beyond (MTP layers excepted), every MoE layer holds exactly the routed experts, and, when the headers were read
    (`shapes`), the attention projections, the embedding and the fused experts have the shapes the heads, head
    dims, hidden size and expert count imply. A config that disagrees with its weights plans a layout vLLM cannot
    load (a TP the heads do not divide, layers of zero bytes). `files` maps each tensor to the file that names it.
    CardError naming the config key, its value, and the tensor and shape that contradict it."""
    layers, mtp = facts["layers"], facts["mtp_layers"] or 0
    seen: dict[int, str] = {}
    for name in sorted(files):
        match = _LAYER.search(name)
        if match and not _NOT_DECODER.search(name):
            seen.setdefault(int(match.group(2)), name)
    if seen:  # a checkpoint that does not name its decoder layers `layers.N.` is not checked here
        missing = [i for i in range(layers) if i not in seen]
        if missing:
            top = max(seen)
            raise CardError(f"config.json: {_key(sources, 'layers')} = {layers} contradicts the weights: no tensor "
                            f"of decoder layers {_spans(missing)} in {files[seen[top]]} or any other file (the last "
                            f"layer they hold is {top}: {seen[top]})")
        beyond = sorted(i for i in seen if i >= layers + mtp)
        if beyond:
            with_mtp = f" + {_key(sources, 'mtp_layers')} = {mtp}" if mtp else ""
            raise CardError(f"config.json: {_key(sources, 'layers')} = {layers}{with_mtp} contradicts the weights: "
                            f"{files[seen[beyond[0]]]} holds {seen[beyond[0]]} (the weights have decoder layers "
                            f"{_spans(beyond)} beyond the config's {layers + mtp})")
    moe = facts["moe"]
    routed = moe["routed_experts"] if moe else None
    if routed:
        experts: dict[int, dict[int, str]] = {}
        for name in files:
            match = _EXPERT.search(name)
            if match:
                experts.setdefault(int(match.group(2)), {}).setdefault(int(match.group(4)), name)
        for layer, held in sorted(experts.items()):
            if set(held) != set(range(routed)):
                top = max(held)
                raise CardError(f"config.json: {_key(sources, 'routed_experts')} = {routed} contradicts the weights: "
                                f"decoder layer {layer} holds {len(held)} experts ({_spans(sorted(held))}; e.g. "
                                f"{held[top]} in {files[held[top]]})")
    if shapes is None:
        return

    def rows(name: str) -> int | None:
        dtype, shape = shapes[name]
        return shape[0] if dtype in _FLOAT and shape else None

    def refuse(fact: str, value: int, name: str, implied: str, want: int) -> None:
        raise CardError(f"config.json: {_key(sources, fact)} = {value} contradicts {name} {shapes[name][1]} in "
                        f"{files[name]}: {implied} = {want} output rows, the tensor has {shapes[name][1][0]}")

    heads, kv, hd, hidden = facts["attention_heads"], facts["kv_heads"], facts["head_dim"], facts["hidden_size"]
    hd_text = f"{_key(sources, 'head_dim')} {hd}"
    mla = facts["mla"]
    for name in sorted(shapes):
        if _NOT_DECODER.search(name) or not _LAYER.search(name):
            if hidden and _EMBED.search(name) and not _NOT_DECODER.search(name) and len(shapes[name][1]) == 2 \
                    and shapes[name][0] in _FLOAT and shapes[name][1][1] != hidden:
                raise CardError(f"config.json: {_key(sources, 'hidden_size')} = {hidden} contradicts {name} "
                                f"{shapes[name][1]} in {files[name]}: the embedding is {shapes[name][1][1]} wide")
            continue
        if routed and _FUSED_EXPERTS.search(name) and shapes[name][1] and shapes[name][1][0] != routed:
            raise CardError(f"config.json: {_key(sources, 'routed_experts')} = {routed} contradicts {name} "
                            f"{shapes[name][1]} in {files[name]}: it stacks {shapes[name][1][0]} experts")
        out = rows(name)
        if out is None:
            continue
        proj = name.rsplit(".", 2)[-2] if name.endswith(".weight") else None
        if mla:
            nope, rope, vdim = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"]
            want = {"q_b_proj": heads * (nope + rope), "q_proj": heads * (nope + rope),
                    "kv_a_proj_with_mqa": mla["kv_lora_rank"] + rope, "kv_b_proj": heads * (nope + vdim),
                    "q_a_proj": mla["q_lora_rank"]}.get(proj or "")
            if ".self_attn." in name and want and out != want:
                fact, value, implied = {
                    "q_b_proj": ("attention_heads", heads, f"{heads} heads x (qk_nope_head_dim {nope} + "
                                 f"qk_rope_head_dim {rope})"),
                    "q_proj": ("attention_heads", heads, f"{heads} heads x (qk_nope_head_dim {nope} + "
                               f"qk_rope_head_dim {rope})"),
                    "kv_a_proj_with_mqa": ("kv_lora_rank", mla["kv_lora_rank"],
                                           f"kv_lora_rank {mla['kv_lora_rank']} + qk_rope_head_dim {rope}"),
                    "kv_b_proj": ("attention_heads", heads, f"{heads} heads x (qk_nope_head_dim {nope} + "
                                  f"v_head_dim {vdim})"),
                    "q_a_proj": ("q_lora_rank", mla["q_lora_rank"], "q_lora_rank"),
                }[proj or ""]
                refuse(fact, value, name, implied, want)
        elif proj in ("q_proj", "k_proj", "v_proj") and re.search(r"\.(self_attn|attention)\.[qkv]_proj\.weight$",
                                                                  name):
            fact, count = ("attention_heads", heads) if proj == "q_proj" else ("kv_heads", kv)
            if out != count * hd:
                refuse(fact, count, name, f"{count} {'heads' if proj == 'q_proj' else 'KV heads'} x {hd_text}",
                       count * hd)


# ------------------------------------------------------------------------------------------------ the card


def _category(name: str, layers: int) -> str:
    match = re.search(r"(^|\.)layers\.(\d+)\.", name)
    if match and int(match.group(2)) >= layers:
        return "unused"
    if EMBEDDING.search(name):
        return "embeddings"
    return classify(name)


def weight_split(sizes: dict[str, int], facts: dict[str, Any]) -> dict[str, Any]:
    """Bytes by how vLLM places them: experts (over EP or DP x TP), dense (over TP), replicated (whole on every
    GPU), embeddings (vocabulary-parallel, over TP), Engram, unused (MTP layers); per decoder layer for PP."""
    layers = facts["layers"]
    cats = ("experts", "dense", "replicated", "engram")
    per_layer = [[0, 0, 0, 0] for _ in range(layers)]
    first = [0, 0, 0, 0]
    last = [0, 0, 0, 0]
    totals = dict.fromkeys((*cats, "embeddings", "unused"), 0)
    for name, size in sizes.items():
        cat = _category(name, layers)
        totals[cat] += size
        if cat == "unused":
            continue
        slot = cats.index("dense" if cat == "embeddings" else cat)
        match = re.search(r"(^|\.)layers\.(\d+)\.", name)
        if match:
            per_layer[int(match.group(2))][slot] += size
        elif re.search(r"(^|\.)(embed|embed_tokens|vision\w*|visual)\.", name):
            first[slot] += size
        else:
            last[slot] += size
    return {"total_bytes": sum(sizes.values()), **{f"{k}_bytes": v for k, v in totals.items()},
            "first_stage_bytes": first, "last_stage_bytes": last, "layer_bytes": per_layer,
            "columns": list(cats)}


FACT_TYPES: dict[str, Any] = {
    "tokenizer_mode": ParserName, "tool_call_parser": ParserName, "reasoning_parser": ParserName,
    "default_kv_cache_dtype": ParserName, "vision": StrictBool, "supports_pp": StrictBool,
    "draft_supports_pp": dict[ParserName, StrictBool],
    "min_vram_gb": Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)],
    "engram_hash_heads": Annotated[StrictInt, Field(ge=1, le=1_000_000)],
    "weights_split_gb": dict[str, Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]],
    "routed_experts": Annotated[StrictInt, Field(ge=1, le=1_000_000)],
    "thinking_kwarg": Literal[THINKING_KWARGS],
}
"""Each fact's type, the one the stack file and the planner use for the same value (ParserName for the names
that go into vLLM's argv, finite bounded numbers): a card never holds a value a stack would refuse."""


def parse_facts(items: Iterable[str]) -> dict[str, Any]:
    """`--fact KEY=VALUE` items, each checked against its fact's type; CardError naming the item and what works."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in FACT_KEYS:
            raise CardError(f"--fact {item!r}: write KEY=VALUE with KEY one of {', '.join(sorted(FACT_KEYS))}")
        kind = FACT_KEYS[key]
        try:
            value: Any = json.loads(text) if kind in (bool, dict, int, float) else text
        except ValueError as exc:
            raise CardError(f"--fact {item!r}: {key} takes a JSON {kind.__name__}") from exc
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CardError(f"--fact {item!r}: {key} takes a JSON {kind.__name__}")
        try:
            value = TypeAdapter(FACT_TYPES[key]).validate_python(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error.get("loc", ()))
            reason = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            join = " " if reason.startswith("is ") else ": "
            raise CardError(f"--fact {item!r}: {key}{'.' + where if where else ''}{join}{reason}") from None
        out[key] = value
    return out


def build_card(source: Source, name: str, *, synthesize_weights: bool, facts_given: dict[str, Any],
               why: str | None, command: list[str]) -> dict[str, Any]:
    raw, cfg = read_config(source)
    facts, sources = model_facts(raw, cfg)
    if "routed_experts" in facts_given:
        if facts["moe"] is not None:
            raise CardError("--fact routed_experts: config.json already names the experts")
        facts["moe"] = {"routed_experts": facts_given["routed_experts"], "active_experts": None,
                        "shared_experts": None, "expert_ffn_size": None, "first_dense_layers": 0}
        sources["routed_experts"] = f"--fact routed_experts (given on the command line: {why or 'no reason'})"
    index = read_index(source)
    weights_source: str
    shards: list[dict[str, Any]] = []
    sizes: dict[str, int] = {}
    dtypes: dict[str, str] = {}
    shapes: dict[str, tuple[str, list[int]]] = {}
    files: dict[str, str] = {}
    index_total = index.get("metadata", {}).get("total_size") if index else None
    if "weights_split_gb" in facts_given:
        split = facts_given["weights_split_gb"]
        need = {"experts", "dense", "replicated", "engram"}
        if set(split) != need or not all(isinstance(x, int | float) and x >= 0 for x in split.values()):
            raise CardError(f"--fact weights_split_gb: a JSON object with exactly {sorted(need)} in GB")
        weights: dict[str, Any] = {"total_bytes": round(sum(split.values()) * 1e9),
                                   **{f"{k}_bytes": round(v * 1e9) for k, v in split.items()},
                                   "embeddings_bytes": None, "unused_bytes": 0, "layer_bytes": None}
        weights_source = f"assumed (--fact weights_split_gb, given on the command line: {why or 'no reason'})"
    else:
        if synthesize_weights:
            shapes = synthesize(facts)
            sizes = {n: _bytes(d, s) for n, (d, s) in shapes.items()}
            dtypes = {n: d for n, (d, _) in shapes.items()}
            weights_source = ("synthesized from config.json with the architecture's checkpoint names and dtypes "
                              "(no shard headers were read)")
            if index:
                check_tensors(facts, sources, dict.fromkeys(index["weight_map"], "model.safetensors.index.json"),
                              None)
                names, indexed = set(sizes), set(index["weight_map"])
                if names != indexed:
                    extra, missing = sorted(names - indexed)[:3], sorted(indexed - names)[:3]
                    raise CardError(f"model.safetensors.index.json: its weight_map and the tensors synthesized from "
                                    f"config.json differ (index lacks {extra}, has unknown {missing})")
                weights_source += "; every name matches model.safetensors.index.json's weight_map"
        elif index:
            if not any(source.exists(shard) for shard in set(index["weight_map"].values())):
                raise CardError(no_shards(source, name, index))
            for shard in sorted(set(index["weight_map"].values())):
                s_sizes, s_dtypes, size, s_shapes = read_shard(source, shard)
                sizes |= s_sizes
                dtypes |= s_dtypes
                shapes |= {n: (s_dtypes[n], x) for n, x in s_shapes.items()}
                files |= dict.fromkeys(s_sizes, shard)
                shards.append({"name": shard, "bytes": size})
            missing = sorted(set(index["weight_map"]) - set(sizes))
            if missing:
                raise CardError(f"model.safetensors.index.json: weight_map names {missing[:3]} "
                                f"({len(missing)} in all) that no shard header holds: truncated or stale index")
            weights_source = "model.safetensors.index.json and every shard's safetensors header"
        elif source.exists("model.safetensors"):
            s_sizes, dtypes, size, s_shapes = read_shard(source, "model.safetensors")
            sizes = s_sizes
            shapes = {n: (dtypes[n], x) for n, x in s_shapes.items()}
            files = dict.fromkeys(s_sizes, "model.safetensors")
            shards.append({"name": "model.safetensors", "bytes": size})
            weights_source = "model.safetensors header"
        else:
            raise CardError(f"{source.label}: neither model.safetensors.index.json nor model.safetensors (pass "
                            "--synthesize-weights to build the tensor list from config.json)")
        if not synthesize_weights:
            check_tensors(facts, sources, files, shapes)
        if index_total is not None and not synthesize_weights and index_total != sum(sizes.values()):
            raise CardError(f"model.safetensors.index.json: metadata.total_size = {index_total}, the shard headers "
                            f"hold {sum(sizes.values())} bytes of tensors")
        weights = weight_split(sizes, facts)
    weights["source"] = weights_source
    weights["index_total_size"] = index_total
    weights["dtypes"] = dict(sorted({d: sum(1 for x in dtypes.values() if x == d) for d in set(dtypes.values())}
                                    .items()))
    weights["shards"] = shards
    serving: dict[str, Any] = {"tokenizer_mode": "auto", "tool_call_parser": None, "reasoning_parser": None,
               "default_kv_cache_dtype": "auto", "supports_pp": True, "draft_supports_pp": {}, "min_vram_gb": None}
    for key in serving:
        if key in facts_given:
            serving[key] = facts_given[key]
            sources[key] = f"--fact {key} (given on the command line)"
    if "thinking_kwarg" in facts_given:  # only when given: the parser's own key needs no entry
        serving["thinking_kwarg"] = facts_given["thinking_kwarg"]
        sources["thinking_kwarg"] = "--fact thinking_kwarg (given on the command line)"
    if "vision" in facts_given:
        facts["vision"] = facts_given["vision"]
        sources["vision"] = "--fact vision (given on the command line)"
    facts["engram_hash_heads"] = facts_given.get("engram_hash_heads")
    if facts["engram_hash_heads"] is not None:
        sources["engram_hash_heads"] = f"--fact engram_hash_heads (given on the command line: {why or 'no reason'})"
    if facts["mtp_layers"]:
        sources["unused_bytes"] = _MTP_SOURCE
    return {"card": CARD_VERSION, "name": name, "generated_by": shlex.join(command), "source": source.label,
            **facts, "weights": weights, "serving": serving, "sources": dict(sorted(sources.items()))}


def write_card(card: dict[str, Any], root: Path) -> Path:
    path = card_path(card["name"], root)
    escaped = escapes(path, root)
    if escaped:  # a models/ that links out of the project: the card would land elsewhere than the message says
        raise CardError(f"{escaped}; make models/ a plain folder of the project")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(card, indent=1) + "\n")
    return path


NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def main(src: str, name: str, *, synthesize_weights: bool, facts: list[str], why: str | None,
         endpoint_url: str | None, region: str | None, root: Path, command: list[str],
         echo: Callable[[str], None], guard_shipped: bool = False, require_project: bool = False,
         on_written: Callable[[Path], list[str]] | None = None) -> int:
    """Write the card of `src` as `name` under `root`; `on_written(root)` then rewrites what lists the cards (the
    command line passes the support-table writer when `root` is this checkout) and returns the files it changed."""
    if not NAME_RE.fullmatch(name):  # not match: `$` lets a trailing newline through
        echo(f"--name {name!r}: lower-case letters, digits, '.', '_', '-' (up to 63), e.g. qwen3-8b")
        return 2
    if require_project and (why_not := not_a_project(root)) is not None:
        echo(f"model-card: nothing was written: {why_not}")
        return 2
    target, shipped = card_path(name, root), SHIPPED / f"{name}.json"  # the command line guards; a test may not
    if guard_shipped and shipped.is_file() and target.resolve() != shipped.resolve():
        echo(f"--name {name!r}: a card of that name ships with vllm-cluster ({shipped}); {target} would hide it "
             f"from every stack under {root}. Give another name, e.g. --name {name}-local, or --override-shipped "
             "to use yours instead (every plan then warns)")
        return 2
    try:
        card = build_card(open_source(src, endpoint_url, region), name, synthesize_weights=synthesize_weights,
                          facts_given=parse_facts(facts), why=why, command=command)
    except CardError as exc:
        echo(f"model-card: {exc}")
        return 2
    if card["family"] not in FAMILIES:
        echo(f"model-card: config.json: architectures[0] {card['architecture']} is family {card['family']}, which "
             f"the planner has no rules for (known: {', '.join(FAMILIES)})")
        return 2
    try:  # what `plan` would refuse is refused here, by the same code
        profile_from_card(card, str(card["source"]))
    except CardProblem as exc:
        echo(f"model-card: {exc}; nothing was written (the planner would refuse this card)")
        return 2
    try:
        path = write_card(card, root)
    except CardError as exc:  # models/ links out of the project
        echo(f"model-card: nothing was written: {exc}")
        return 2
    except OSError as exc:  # `models` is a file, a folder in the way of the card, no permission
        echo(f"model-card: cannot write {card_path(name, root)}: {exc.strerror or exc}; {root / 'models'} must be "
             "a writable directory (move what is in the way)")
        return 2
    w = card["weights"]
    echo(f"wrote {path}: {card['architecture']} ({card['family']}), {card['layers']} layers, "
         f"{w['total_bytes'] / 1e9:.2f} GB of weights ({w['source'].split(' (')[0].split(';')[0]})")
    if on_written is not None:
        changed = on_written(root)
        if changed:
            echo(f"wrote {', '.join(changed)}: the support tables now list {name} (commit them with the card)")
    return 0


def _weights_from(card: dict[str, Any], root: Path) -> str:
    """Where a card's bytes come from, and for a synthesized one what real figures checked it: the published index
    beside its config.json, or `published-shards.json` there (sizes and digests of the real checkpoint's shard files,
    which tests/test_model_cards.py rebuilds from the card's tensors)."""
    w = card["weights"]
    if w["source"].startswith("assumed"):
        return "assumed (--fact)"
    if not w["source"].startswith("synthesized"):
        return "safetensors headers"
    shards = root / str(card["source"]) / "published-shards.json"
    published = json.loads(shards.read_text()) if shards.is_file() else None
    files = f"the {len(published['shards'])} shard files of {published['model']}" if published else ""
    if w.get("index_total_size") == w["total_bytes"]:
        return "synthesized from config.json; = the published index's total_size" + (f" and {files}" if files else "")
    if files:
        return f"synthesized from config.json; checked against {files}"
    return "synthesized from config.json; nothing published to check it against"


def support_matrix(models_dir: Path) -> str:
    """The Markdown table of docs/your-model.md: one row per committed card (`source` paths are relative to the
    project root above `models_dir`)."""
    rows = ["| card | architecture | family | layers | heads / KV heads | experts (active) | max_model_len | "
            "weights GB | weights from |", "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(models_dir.glob("*.json")):
        c = json.loads(path.read_text())
        moe = c.get("moe") or {}
        experts = f"{moe['routed_experts']} ({moe.get('active_experts') or '?'})" if moe else "dense"
        kv = "MLA" if c.get("mla") else "compressed MLA" if c["family"] == "deepseek-v4" else str(c["kv_heads"])
        where = _weights_from(c, models_dir.parent)
        rows.append(f"| {c['name']} | {c['architecture']} | {c['family']} | {c['layers']} | "
                    f"{c['attention_heads']} / {kv} | {experts} | {c['max_model_len']} | "
                    f"{c['weights']['total_bytes'] / 1e9:.1f} | {where} |")
    return "\n".join(rows) + "\n"
