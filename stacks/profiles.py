"""Model profiles: the facts about a model that the topology rules need.

Numbers marked `assumed` are not published in the seeds; preflight reads the real `config.json` on every
node and fails when it disagrees with the profile (see checks/preflight.py), so a wrong guess here is caught
before weights load, not forty minutes after.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    tool_call_parser: str
    reasoning_parser: str
    default_kv_cache_dtype: str
    weights_gb: float
    min_vram_gb: float | None
    max_context: int
    sources: dict[str, str] = field(default_factory=dict)
    moe: bool = True
    """Mixture of experts (DeepSeek V4/V4.1 are: `n_routed_experts` in config.json). vLLM 0.33.0 runs the DP
    ranks of a dense model as independent replicas, which breaks DP over replicas that span nodes."""


PROFILES: dict[str, ModelProfile] = {
    "deepseek-v4.1-flash": ModelProfile(
        key="deepseek-v4.1-flash",
        architecture="DeepseekV41ForCausalLM",
        num_attention_heads=64,
        o_groups=8,
        engram_hash_heads=24,
        supports_pp=True,
        draft_supports_pp={"dspark": False},
        vision=True,
        tokenizer_mode="deepseek_v41",
        tool_call_parser="deepseek_v41",
        reasoning_parser="deepseek_v41",
        default_kv_cache_dtype="fp8_ds_mla",
        weights_gb=511,
        min_vram_gb=614,
        max_context=1_048_576,
        sources={
            "o_groups": "seed 000: TP8 works, TP16 gives n_local_groups == 0, so 8 <= o_groups < 16",
            "engram_hash_heads": "seed 000: '24 heads over TP=16 x DP=1'",
            "num_attention_heads": "assumed; preflight compares with config.json",
            "weights_gb": "seed 000: ~511 GB of files, ~614 GB minimum VRAM",
            "draft_supports_pp": "seed 000: DSpark draft does not implement SupportsPP",
        },
    ),
    "deepseek-v4-flash": ModelProfile(
        key="deepseek-v4-flash",
        architecture="DeepseekV4ForCausalLM",
        num_attention_heads=64,
        o_groups=8,
        engram_hash_heads=None,
        supports_pp=True,
        draft_supports_pp={},
        vision=False,
        tokenizer_mode="deepseek_v4",
        tool_call_parser="deepseek_v4",
        reasoning_parser="deepseek_v4",
        default_kv_cache_dtype="fp8",
        weights_gb=290,
        min_vram_gb=None,
        max_context=1_048_576,
        sources={
            "supports_pp": "seed 001: TP8 x PP2 baseline runs",
            "o_groups": "assumed equal to V4.1 (same FlashMLA path); preflight compares with config.json",
            "num_attention_heads": "assumed; preflight compares with config.json",
            "weights_gb": "assumed FP8 size; set model.weights_gb to the real size",
        },
    ),
}


def get_profile(key: str) -> ModelProfile | None:
    return PROFILES.get(key)
