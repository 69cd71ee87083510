"""Model profiles: the facts about a model that the topology and memory rules need.

Numbers marked `assumed` are not published in the seeds; preflight reads the real `config.json` on every
node and fails when it disagrees with the profile (see checks/preflight.py), so a wrong guess here is caught
before weights load, not forty minutes after. The memory figures (`weight_split`, `kv_ratios`) are assumptions
too: the node preflight recomputes them from the real config.json and safetensors headers (stacks/planner/memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stacks.planner.memory import WeightSplit


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
    weight_split: WeightSplit
    """How vLLM places the weights (stacks/planner/memory.py); sums to `weights_gb`."""
    kv_ratios: tuple[int, ...]
    """Compress ratio of every decoder layer (1 = sliding window only), for the KV bytes per token."""
    sources: dict[str, str] = field(default_factory=dict)
    moe: bool = True
    """Mixture of experts (DeepSeek V4/V4.1 are: `n_routed_experts` in config.json). vLLM 0.33.0 runs the DP
    ranks of a dense model as independent replicas, which breaks DP over replicas that span nodes."""


def _alternating(layers: int) -> tuple[int, ...]:
    return tuple(4 if i % 2 == 0 else 128 for i in range(layers))


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
        weight_split=WeightSplit(experts_gb=275.5, dense_gb=28.3, replicated_gb=5.0, engram_gb=202.2),
        kv_ratios=_alternating(61),
        sources={
            "weight_split": "assumed, derived from seed 000 (552B backbone + 196B Engram, ~511 GB of files): Engram "
                            "tables are FP8 rows + one UE8M0 scale byte per 32 values (ParallelEngramEmbedding), "
                            "196 x 1.03125 = 202.2 GB; the 308.8 GB backbone solved for 552B parameters with MXFP4 "
                            "routed experts (0.53125 B/param, vLLM's default expert_dtype fp4) and FP8 dense "
                            "(1 B/param): 518.7B experts = 275.5 GB, 33.3B dense of which ~15% replicated "
                            "(wq_a/wkv, compressor, indexer, router, norms: per-layer shapes of V4); the preflight "
                            "reads the real split from the safetensors headers",
            "kv_ratios": "assumed: 61 layers alternating compress ratio 4 (with indexer) and 128, like V4's "
                         "interleaved compressed attention; the preflight reads layer_types/compress_rates",
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
        weight_split=WeightSplit(experts_gb=282.0, dense_gb=6.8, replicated_gb=1.2, engram_gb=0.0),
        kv_ratios=_alternating(43),
        sources={
            "weight_split": "assumed: the 290 GB above split like a 284B-parameter MoE with ~7B dense parameters "
                            "(~97% routed experts), 15% of dense replicated; no Engram in V4; the preflight reads "
                            "the real split from the safetensors headers",
            "kv_ratios": "assumed: 43 layers alternating compress ratio 4 (with indexer) and 128; the preflight "
                         "reads layer_types/compress_rates from config.json",
            "supports_pp": "seed 001: TP8 x PP2 baseline runs",
            "o_groups": "assumed equal to V4.1 (same FlashMLA path); preflight compares with config.json",
            "num_attention_heads": "assumed; preflight compares with config.json",
            "weights_gb": "assumed FP8 size; set model.weights_gb to the real size",
        },
    ),
}


def get_profile(key: str) -> ModelProfile | None:
    return PROFILES.get(key)
