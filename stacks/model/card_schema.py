"""The fields of a model card (`models/<name>.json`) that a plan reads, typed and bounded.

A card is a file a user can edit by hand: a zero, a negative, NaN, a string, a huge number, an unknown family or a
wrong shape must stop the plan with the card's file and the field's path, never reach the arithmetic (a division
by zero heads, NaN weights) or give a plan on impossible numbers. Fields a plan does not read are left as they are
(`extra="allow"`); `python -m stacks model-card` writes cards these types accept.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

FAMILIES = ("dense-gqa", "moe-gqa", "moe-mla", "dense-mla", "deepseek-v4")
"""The architecture families the rules know (stacks/planner/validation.py `_model_rules`)."""
THINKING_KWARGS = ("thinking", "enable_thinking", "reasoning_effort")
"""How a request turns a model's reasoning on and off (stacks/planner/model_cards.py says which parser reads which)."""
MAX_BYTES = 1e15
"""1 PB: above any checkpoint (the largest published ones are a few TB)."""
MAX_CONTEXT = 1 << 27
"""134M tokens: above any context length a model card records (10M is the largest published)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")


def _name(value: str) -> str:
    """fullmatch, not `$`: a trailing newline passes a `$` pattern."""
    if not _NAME.fullmatch(value):
        raise ValueError("not a card name: 1-128 of A-Z a-z 0-9 . _ -, one line")
    return value


def _word(value: str) -> str:
    if not _WORD.fullmatch(value):
        raise ValueError("not one word (1-128 of A-Z a-z 0-9 _ . : / -, one line)")
    return value


Name = Annotated[str, AfterValidator(_name)]
Word = Annotated[str, AfterValidator(_word)]
Count = Annotated[int, Field(ge=1, le=1 << 20)]
"""Heads, layers, experts, sizes: at least 1, at most a million."""
Bytes = Annotated[float, Field(ge=0, le=MAX_BYTES, allow_inf_nan=False)]
StageBytes = Annotated[list[Bytes], Field(min_length=4, max_length=4)]
"""(experts, dense, replicated, Engram) bytes of a layer or a pipeline stage."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class Mla(_Part):
    kv_lora_rank: Count
    qk_rope_head_dim: Count


class Moe(_Part):
    routed_experts: Count
    expert_ffn_size: Count | None = None


class Quantization(_Part):
    method: Word | None = None
    block_size: Annotated[list[Count], Field(min_length=2, max_length=2)] | None = None
    """FP8 block sizes: 0 would divide by zero in vLLM's block check and in the plan's."""


class Shard(_Part):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-][A-Za-z0-9_./-]{0,254}$")]
    """A weight file as the index names it, relative to the model directory (the load-format rules match it)."""


class Weights(_Part):
    experts_bytes: Bytes
    dense_bytes: Bytes
    replicated_bytes: Bytes
    engram_bytes: Bytes
    total_bytes: Bytes | None = None
    """The weight files' size, as `model-card` summed it (informational: the plan adds the parts)."""
    embeddings_bytes: Bytes | None = None
    layer_bytes: Annotated[list[StageBytes], Field(max_length=1 << 12)] | None = None
    first_stage_bytes: StageBytes | None = None
    last_stage_bytes: StageBytes | None = None
    source: Annotated[str, Field(max_length=4096)]
    shards: Annotated[list[Shard], Field(max_length=1 << 16)] | None = None
    """The weight files the card was read from; empty where it was synthesized or assumed."""


class Serving(_Part):
    supports_pp: bool
    draft_supports_pp: dict[Word, bool]
    tokenizer_mode: Word
    tool_call_parser: Word | None
    reasoning_parser: Word | None
    default_kv_cache_dtype: Word
    min_vram_gb: Annotated[float, Field(gt=0, lt=10_000, allow_inf_nan=False)] | None
    thinking_kwarg: Literal["thinking", "enable_thinking", "reasoning_effort"] | None = None


class CardFields(_Part):
    """What `stacks/planner/model_cards.profile_from_card` reads; each bound says what no real model has."""

    name: Name
    architecture: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,127}$")]
    """Rust's regex (pydantic-core): `$` is the end of the text, a trailing newline does not match."""
    model_type: Word | None = None
    family: Literal["dense-gqa", "moe-gqa", "moe-mla", "dense-mla", "deepseek-v4"]
    layers: Annotated[int, Field(ge=1, le=4096)]
    attention_heads: Count
    kv_heads: Count
    head_dim: Count
    hidden_size: Count | None = None
    vocab_size: Count | None = None
    max_model_len: Annotated[int, Field(ge=1, le=MAX_CONTEXT)]
    sliding_window: Annotated[int, Field(ge=1, le=MAX_CONTEXT)] | None = None
    layer_types: Annotated[list[Word], Field(max_length=4096)] | None = None
    kv_ratios: Annotated[list[Count], Field(max_length=4096)] | None = None
    o_groups: Count | None = None
    engram_hash_heads: Count | None = None
    vision: bool
    dtype: Literal["half", "float16", "float", "float32", "bfloat16"] | None = None
    """config.json's torch_dtype, as vLLM 0.33.0 maps it (_STR_DTYPE_TO_TORCH_DTYPE, vllm/config/model.py:2384-2390)."""
    mla: Mla | None = None
    moe: Moe | None = None
    quantization: Quantization | None = None
    weights: Weights
    serving: Serving
    sources: dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=4096)]]


def layer_count_problem(fields: CardFields) -> tuple[str, str] | None:
    """(field, why) when a per-layer list does not have one entry per layer (the plan indexes it by layer)."""
    for field, items in (("layer_types", fields.layer_types), ("kv_ratios", fields.kv_ratios),
                         ("weights.layer_bytes", fields.weights.layer_bytes)):
        if items and len(items) != fields.layers:
            return field, f"has {len(items)} entries and the card has {fields.layers} layers: one per layer"
    return None
