"""Model profiles: the facts about a model that the topology and memory rules need, read from its card.

A card is `models/<name>.json`, written by `python -m stacks model-card SRC --name NAME` from the model's own
`config.json` and safetensors headers (review/model_card.py) and committed for review; `model.profile: NAME`
names it. Cards are looked up under the project root (stacks/project.py) first, then among the cards shipped
with vllm-cluster. Every fact in a card says where it came from (`sources`); the node preflight reads the real
config.json again on every node (checks/preflight.py), so a card that disagrees with the files is caught before
weights load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stacks.model.card_schema import FAMILIES, THINKING_KWARGS, CardFields, layer_count_problem
from stacks.model.errors import show_value
from stacks.model.project import STACKS, project_root, shipped
from stacks.planner.memory import WeightSplit

CARD_VERSION = 1
__all__ = ["FAMILIES", "THINKING_KWARGS"]  # the card's types live in stacks/model/card_schema.py
SHIPPED = shipped("models")
"""The cards that ship with vllm-cluster (this checkout's models/, or the wheel's package data)."""


def card_root() -> Path:
    """The user's project, whose `models/` holds their own cards (asked at each call: tests set the variable)."""
    return project_root()


def card_path(name: str, root: Path | None = None) -> Path:
    return (root or card_root()) / "models" / f"{name}.json"


@dataclass(frozen=True)
class ModelProfile:
    key: str
    architecture: str
    num_attention_heads: int
    o_groups: int | None
    engram_hash_heads: int | None
    supports_pp: bool
    draft_supports_pp: dict[str, bool]
    vision: bool
    tokenizer_mode: str
    tool_call_parser: str | None
    reasoning_parser: str | None
    default_kv_cache_dtype: str
    weights_gb: float
    min_vram_gb: float | None
    max_context: int
    weight_split: WeightSplit
    """How vLLM places the weights (stacks/planner/memory.py); sums to `weights_gb`."""
    kv_ratios: tuple[int, ...]
    """Compress ratio of every decoder layer (DeepSeek V4; 1 = sliding window only); empty for other families."""
    sources: dict[str, str] = field(default_factory=dict)
    moe: bool = True
    """Mixture of experts. vLLM 0.33.0 runs the DP ranks of a dense model as independent replicas, which breaks DP
    over replicas that span nodes."""
    family: str = "deepseek-v4"
    layers: int = 0
    kv_heads: int = 1
    head_dim: int = 0
    routed_experts: int | None = None
    mla_head: int | None = None
    """kv_lora_rank + qk_rope_head_dim of an MLA model (its KV cache entry per layer and token)."""
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    layer_split: tuple[tuple[float, float, float, float], ...] | None = None
    """GB per decoder layer (experts, dense, replicated, Engram), for PP stages; None where the card's split is
    assumed (the stages then get equal shares)."""
    first_stage: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    last_stage: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    weights_source: str = ""
    fp8_block_experts: tuple[int, int] | None = None
    """(block_n, expert FFN size) of an FP8 block-quantized MoE: each rank's FFN slice must fill whole blocks."""
    mxfp4_experts: tuple[int, int] | None = None
    """(hidden_size, expert FFN size) of an MXFP4 MoE: vLLM pads both for its kernels (load_estimate.py)."""
    quantization: str | None = None
    """The checkpoint's quantization method (config.json `quantization_config.quant_method`), None if unquantized."""
    model_type: str | None = None
    """config.json's `model_type`: vLLM picks some quantization methods by it (stacks/planner/quantization_rules.py)."""
    dtype: str = "bfloat16"
    """The checkpoint's dtype as the card records it (`torch_dtype`)."""
    weight_files: tuple[str, ...] = ()
    """The weight files the card was read from (`weights.shards`); empty where the card synthesized or assumed
    them, so the load-format rules cannot check the model directory's file layout (stacks/planner/load_formats.py)."""
    thinking_kwarg: str | None = None
    """The card's `serving.thinking_kwarg` (one of THINKING_KWARGS) when given; else derived from the parser."""


# THINKING_KWARGS: how a request turns a model's reasoning on and off: `chat_template_kwargs: {"thinking": bool}`
# (DeepSeek's templates), `chat_template_kwargs: {"enable_thinking": bool}` (Qwen3's), or the request's
# `reasoning_effort` (gpt-oss: harmony always reasons; the effort is low, medium or high).
THINKING_KWARG_BY_PARSER = {
    # vllm/parser/deepseek_v4.py:255-261 (deepseek_v4 and deepseek_v41: `thinking` or `enable_thinking`, on when
    # neither is sent); vllm/reasoning/deepseek_v3_reasoning_parser.py:28-31 (either, off when neither is sent)
    "deepseek_v3": "thinking", "deepseek_v4": "thinking", "deepseek_v41": "thinking",
    # vllm/parser/qwen3.py:317-318: only `enable_thinking`, on when it is not sent ("thinking" is ignored)
    "qwen3": "enable_thinking",
    # vllm/reasoning/gptoss_reasoning_parser.py:16-21 (harmony parses the output, reasoning is always there);
    # vllm/entrypoints/openai/parser/harmony_utils.py:68-72,123-132 (reasoning_effort low, medium or high)
    "openai_gptoss": "reasoning_effort",
}
"""vLLM 0.33.0's reasoning parsers and the request key each reads. A parser not listed gets `enable_thinking`, the
key vLLM itself sets from `reasoning_effort` (vllm/entrypoints/openai/chat_completion/protocol.py:665-666); a card's
`serving.thinking_kwarg` (`model-card --fact thinking_kwarg=...`) overrides both."""


def thinking_request(profile: ModelProfile, reasoning_parser: str | None) -> tuple[str | None, str]:
    """(the request key that turns reasoning on and off, where it came from); (None, why) when the stack serves
    no reasoning parser, so no response carries reasoning and no thinking check can pass."""
    parser = reasoning_parser or profile.reasoning_parser
    if parser is None:
        return None, f"the card {profile.key} names no reasoning parser and serving.reasoning_parser is not set"
    if profile.thinking_kwarg:
        return profile.thinking_kwarg, f"the card {profile.key}: serving.thinking_kwarg"
    if parser in THINKING_KWARG_BY_PARSER:
        return THINKING_KWARG_BY_PARSER[parser], f"vLLM's {parser} reasoning parser"
    return "enable_thinking", (f"reasoning parser {parser}: its key is not known here, so the check sends "
                               "enable_thinking, the key vLLM sets itself; if the model's template reads another, "
                               "regenerate the card with --fact thinking_kwarg=thinking (or reasoning_effort)")


class CardProblem(Exception):
    """A card that cannot be read or that the rules refuse: the file and what is wrong. A config problem (exit 2),
    never an internal error: a card is a file the user wrote or edited."""


MIN_WEIGHT_BYTES = 1e7
"""10 MB: no model vLLM serves is smaller. `model-card` refuses to write such a card and `plan` refuses to read
one (both through `card_weights_problem`)."""


def card_weights_problem(total: float) -> str | None:
    """What is wrong with a card's weight bytes (experts + dense + embeddings), or None: the one rule `model-card`
    and the planner share."""
    if not math.isfinite(total) or total < MIN_WEIGHT_BYTES:
        return (f"weights add up to {total:g} bytes, below the {MIN_WEIGHT_BYTES / 1e6:g} MB that no model vLLM "
                "serves is smaller than (a partial checkpoint, or the wrong directory)")
    return None


def regenerate_hint(path: str) -> str:
    """How to rewrite a card: the command it records (`generated_by`), or the general form. Something other than a
    file in the card's place (a directory, a link to nowhere or to a device, a file where models/ belongs) is
    never read: it is to be moved away."""
    if not Path(path).is_file() or not Path(path).name.endswith(".json"):
        return f"move {path} away (cards are files models/<name>.json), then write the card there"
    try:
        card = json.loads(Path(path).read_text())
        command = card.get("generated_by") if isinstance(card, dict) else None
    except (OSError, ValueError, RecursionError):
        command = None
    name = Path(path).stem
    if isinstance(command, str) and command.startswith("python -m stacks model-card ") and command.isprintable():
        return f"regenerate it from the model's files: {command} (the command the card records)"
    return f"regenerate it from the model's files: {STACKS} model-card SRC --name {name}"


def card_fields_problem(card: dict[str, Any]) -> str | None:
    """The first field of the card that is missing, of the wrong type or out of bounds (stacks/model/card_schema.py),
    as `field PATH = VALUE: why`; None when every field a plan reads is sound."""
    try:
        fields = CardFields.model_validate(card)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        at = ".".join(str(part) for part in error["loc"]) or "(the card)"
        shown = "missing" if error["type"] == "missing" else f"= {show_value(error.get('input'))}"
        return f"field {at} {shown}: {error['msg'].removeprefix('Value error, ')}"
    wrong = layer_count_problem(fields)
    return f"field {wrong[0]} {wrong[1]}" if wrong else None


def _gb(values: list[Any]) -> tuple[float, float, float, float]:
    a, b, c, d = (float(x) / 1e9 for x in values)
    return a, b, c, d


def profile_from_card(card: dict[str, Any], where: str) -> ModelProfile:
    """The planner's view of a card."""
    try:
        if type(card.get("card")) is not int or card.get("card") != CARD_VERSION:  # `true` is not version 1
            raise CardProblem(f"{where}: card version {card.get('card')!r}, this planner reads {CARD_VERSION}")
        fields_problem = card_fields_problem(card)
        if fields_problem:
            raise CardProblem(f"{where}: {fields_problem}")
        w, s = card["weights"], card["serving"]
        total = float(w["experts_bytes"]) + float(w["dense_bytes"]) + float(w.get("embeddings_bytes") or 0)
        too_small = card_weights_problem(total)
        if too_small:
            raise CardProblem(f"{where}: {too_small}")
        kwarg = s.get("thinking_kwarg")
        if kwarg is not None and kwarg not in THINKING_KWARGS:
            raise CardProblem(f"{where}: serving.thinking_kwarg {kwarg!r} is not one of {', '.join(THINKING_KWARGS)}")
        vram = s.get("min_vram_gb")
        if vram is not None and not (isinstance(vram, (int, float)) and math.isfinite(vram) and 0 < vram < 10_000):
            raise CardProblem(f"{where}: serving.min_vram_gb {vram!r} is not a GPU memory size in GB (0 to 10000)")
        split = WeightSplit(experts_gb=w["experts_bytes"] / 1e9,
                            dense_gb=(w["dense_bytes"] + (w.get("embeddings_bytes") or 0)) / 1e9,
                            replicated_gb=w["replicated_bytes"] / 1e9, engram_gb=w["engram_bytes"] / 1e9)
        layers = int(card["layers"])
        types = card.get("layer_types") or []
        window = card.get("sliding_window")
        sliding = tuple(bool(window) and (not types or types[i] == "sliding_attention") for i in range(layers))
        if types and "full_attention" not in types and "sliding_attention" not in types:
            sliding = tuple(False for _ in range(layers))
        if not types and window and card.get("model_type") == "gpt_oss":  # gpt_oss.py:175: even layers slide
            sliding = tuple(i % 2 == 0 for i in range(layers))
        mla = card.get("mla")
        moe = card.get("moe")
        return ModelProfile(
            key=card["name"], architecture=card["architecture"], num_attention_heads=int(card["attention_heads"]),
            o_groups=card.get("o_groups"), engram_hash_heads=card.get("engram_hash_heads"),
            supports_pp=bool(s["supports_pp"]), draft_supports_pp=dict(s["draft_supports_pp"]),
            vision=bool(card["vision"]), tokenizer_mode=s["tokenizer_mode"], tool_call_parser=s["tool_call_parser"],
            reasoning_parser=s["reasoning_parser"], default_kv_cache_dtype=s["default_kv_cache_dtype"],
            weights_gb=round(split.total_gb, 1), min_vram_gb=s["min_vram_gb"], max_context=int(card["max_model_len"]),
            weight_split=split, kv_ratios=tuple(card.get("kv_ratios") or ()), sources=dict(card["sources"]),
            moe=moe is not None, family=card["family"], layers=layers, kv_heads=int(card["kv_heads"]),
            head_dim=int(card["head_dim"]), routed_experts=moe["routed_experts"] if moe else None,
            mla_head=(mla["kv_lora_rank"] + mla["qk_rope_head_dim"]) if mla else None,
            sliding_window=window if any(sliding) else None, sliding_layers=sliding,
            layer_split=tuple(_gb(x) for x in w["layer_bytes"]) if w.get("layer_bytes") else None,
            first_stage=_gb(w.get("first_stage_bytes") or [0, 0, 0, 0]),
            last_stage=_gb(w.get("last_stage_bytes") or [0, 0, 0, 0]), weights_source=w["source"],
            fp8_block_experts=(int(card["quantization"]["block_size"][0]), int(moe["expert_ffn_size"]))
            if moe and moe.get("expert_ffn_size") and (card.get("quantization") or {}).get("method") == "fp8"
            and card["quantization"].get("block_size") else None,
            mxfp4_experts=(int(card["hidden_size"]), int(moe["expert_ffn_size"]))
            if moe and (card.get("quantization") or {}).get("method") == "mxfp4" else None,
            quantization=(card.get("quantization") or {}).get("method"), dtype=str(card.get("dtype") or "bfloat16"),
            thinking_kwarg=kwarg, model_type=card.get("model_type"),
            weight_files=tuple(str(s["name"]) for s in w.get("shards") or ()))
    except (LookupError, TypeError, ValueError, AttributeError) as exc:
        raise CardProblem(f"{where}: not a model card ({type(exc).__name__}: {exc})") from exc


@lru_cache(maxsize=64)
def _load(path: str, mtime: float) -> ModelProfile:
    try:
        card = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CardProblem(f"{path}: not JSON ({exc})") from exc
    except RecursionError:  # `[[[[…]]]]` nested past what Python's JSON reader follows
        raise CardProblem(f"{path}: not a model card: JSON nested deeper than a card ever is") from None
    if not isinstance(card, dict):
        raise CardProblem(f"{path}: not a JSON object")
    return profile_from_card(card, path)


def card_names() -> list[str]:
    names = {p.stem for root in (card_root() / "models", SHIPPED) if root.is_dir() for p in root.glob("*.json")
             if p.is_file()}  # a directory, a link to nowhere or a device named like a card is no card
    return sorted(names)


def shadowed_card(key: str) -> tuple[Path, Path] | None:
    """(the project root's card, the shipped card) when `models/<key>.json` exists in both: the project's wins.
    `model-card` refuses to write such a card; one put there by hand is named in every plan."""
    if not key or "/" in key or key.startswith("."):
        return None
    mine, shipped = card_root() / "models" / f"{key}.json", SHIPPED / f"{key}.json"
    if mine.is_file() and shipped.is_file() and mine.resolve() != shipped.resolve():
        return mine, shipped
    return None


def get_profile(key: str) -> ModelProfile | None:
    """The card `models/<key>.json`; None when there is none. A broken card raises CardProblem."""
    if not key or "/" in key or key.startswith("."):
        return None
    mine = card_root() / "models"
    if mine.exists() and not mine.is_dir():
        raise CardProblem(f"{mine}: is a file where the directory of model cards belongs: move it away, then "
                          f"put the cards in {mine}/")
    for root in (mine, SHIPPED):
        path = root / f"{key}.json"
        if path.is_file():
            profile = _load(str(path), path.stat().st_mtime)
            if profile.key != key:
                raise CardProblem(f"{path}: field name {profile.key!r} is not the file's name {key!r}: the plan "
                                  f"would use one card under two names; set \"name\": \"{key}\" or rename the file")
            return profile
        if path.exists() or path.is_symlink():
            what = ("a directory" if path.is_dir() else "a link to nowhere" if not path.exists() else
                    "not a regular file")
            raise CardProblem(f"{path}: is {what}, not a model card file: remove it, or put the card there")
    return None
