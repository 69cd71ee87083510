"""GPU memory of one engine rank: which weights each GPU holds whole or as a shard, and the KV cache of one sequence.

Standard library only: `checks/bundle.py` pastes this module into the host preflight, which feeds it the real
`config.json` and safetensors headers; `stacks/planner/validation.py` feeds it the profile's figures. Both use the same
formula, so the plan and the node agree on what "fits" means.

What vLLM 0.33.0 does with DeepSeek V4 / V4.1 (the files it comes from):
- routed experts: FusedMoE shards them over DP x TP of a PP stage, with or without `--enable-expert-parallel`
  (whole experts with EP, slices without): `model_executor/layers/fused_moe/config.py`,
  `FusedMoEParallelConfig.make` / `flatten_tp_across_dp_and_pcp`.
- dense weights live in every DP rank: column/row-parallel ones (wq_b, wo_a, wo_b, shared experts, vocab-parallel
  embedding and head, Engram's wkv) are split over TP; the ones built with `disable_tp` or `ReplicatedLinear`
  (fused wq_a+wkv, compressor wkv/wgate, indexer wq_b/weights_proj/wk, the router gate) plus norms and
  hyper-connection weights are whole on every GPU: `models/deepseek_v4{,1}/attention.py`, `compressor.py`,
  `model_executor/layers/fused_moe/router/gate_linear.py`.
- Engram tables (V4.1): hash heads split over TP, and over a node-local group of DP ranks when whole DP replicas
  share a node (`distributed/parallel_state.py` `_engram_dp_shard_size`); kept in pinned host memory unless
  `--engram-config '{"cpu_offload": false}'` (`config/engram.py`, `EngramConfig.cpu_offload = True`;
  `models/deepseek_v41/common/engram.py`, `ParallelEngramEmbedding`).
- KV cache: the MLA latent cache is not split over TP (`max_tp_shards=1`), so every GPU of a DP replica holds the
  cache of its PP stage's layers. A layer with compress ratio r > 1 stores one state per r tokens: 584 bytes with
  `fp8_ds_mla` (448 NoPE + 128 RoPE + 8 scale), else head_dim x dtype bytes; ratio-4 layers add an indexer cache
  of 132 bytes (FP8) per state; ratio-1 layers only keep a 128-token sliding window
  (`models/deepseek_v4/attention.py` `get_kv_cache_spec`, `DeepseekV4Indexer`). vLLM refuses to start when one
  `max_model_len` sequence does not fit (`v1/core/kv_cache_planning.py`, `_check_enough_kv_cache_memory`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GB = 1e9
RUNTIME_RESERVE_GB = 4.0
"""Assumed per-GPU memory outside weights and KV inside vLLM's budget: activations of one scheduler step, CUDA
graphs, NCCL and expert-parallel all-to-all buffers. Not read from code: vLLM measures it at start (profile_run);
users report `--gpu-memory-utilization` targets unreachable under EP when this is ignored (brief 8)."""
HOST_GB_PER_RANK = 4.0
"""Assumed host memory of one vLLM worker process (Python, torch, CUDA context), on top of pinned Engram tables."""
FP8_DS_MLA_STATE_BYTES = 584
INDEXER_STATE_BYTES = 132
KV_ELEMENT_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "auto": 2, "bfloat16": 2, "float16": 2, "half": 2}

_EXPERT = re.compile(r"(^|\.)experts\.(\d+\.|gate_up_proj|down_proj)")
"""Routed experts: one tensor per expert (`experts.7.w1`), or all experts fused (gpt-oss
`experts.gate_up_proj_blocks`)."""
_ENGRAM_TABLE = re.compile(r"(^|\.)engram\.embed(_tokens)?\.")
_REPLICATED = re.compile(
    r"(^|\.)attn\.(wq_a|wkv|fused_wqa_wkv)\.|(^|\.)compressor\.(wkv|wgate|fused_wkv_wgate)\.|"
    r"(^|\.)indexer\.(wq_b|weights_proj|wk)\.|(^|\.)ffn\.gate\.|norm\.|(^|\.)hc_|(^|\.)engram\.[qk]_weight$|"
    r"(^|\.)(mlp|block_sparse_moe)\.(gate|router)\.|(^|\.)self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.")
"""Whole on every GPU. Hugging Face names too: the MoE router (`mlp.gate`, gpt-oss `mlp.router`, Mixtral
`block_sparse_moe.gate`: ReplicatedLinear / GateLinear, vLLM mixtral.py:111, gate_linear.py:22) and MLA's
down-projections (`q_a_proj` + `kv_a_proj_with_mqa`, vLLM's fused_qkv_a_proj with disable_tp=True in
models/deepseek_v2.py)."""
EMBEDDING = re.compile(r"(^|\.)(embed_tokens|lm_head|embed|head)\.weight$")
"""Vocabulary-parallel embedding and LM head: split over TP like dense weights, reported apart on a model card."""
_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_FIRST_STAGE = re.compile(r"(^|\.)(embed|embed_tokens|vision\w*|visual)\.")


@dataclass(frozen=True)
class WeightSplit:
    """Weight bytes (GB) by how vLLM places them."""

    experts_gb: float
    dense_gb: float
    """split over TP"""
    replicated_gb: float
    """whole on every GPU"""
    engram_gb: float

    @property
    def total_gb(self) -> float:
        return self.experts_gb + self.dense_gb + self.replicated_gb + self.engram_gb

    def scaled(self, total_gb: float) -> WeightSplit:
        """The same proportions at another total (`model.weights_gb` overrides the profile's size)."""
        f = total_gb / self.total_gb
        return WeightSplit(self.experts_gb * f, self.dense_gb * f, self.replicated_gb * f, self.engram_gb * f)

    def divided(self, parts: int) -> WeightSplit:
        return WeightSplit(self.experts_gb / parts, self.dense_gb / parts, self.replicated_gb / parts,
                           self.engram_gb / parts)


@dataclass(frozen=True)
class GpuMemory:
    """What one GPU holds (GB), and the pinned host memory Engram needs per node."""

    experts: float
    dense: float
    replicated: float
    engram: float
    kv: float
    reserve: float
    engram_host_per_node: float
    max_model_len: int
    kv_bytes_per_token: float
    redundant_experts: float = 0.0
    """EPLB's redundant expert copies on this GPU (`parallelism.eplb.num_redundant_experts`)."""

    @property
    def weights(self) -> float:
        return self.experts + self.redundant_experts + self.dense + self.replicated + self.engram

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.reserve

    def weights_text(self) -> str:
        parts = [f"experts {self.experts:.1f}"] if self.experts or self.redundant_experts else []
        parts += [f"redundant experts {self.redundant_experts:.1f}"] if self.redundant_experts else []
        parts.append(f"dense {self.dense:.1f}")  # a dense model: no expert part; norms alone round to 0.0
        parts += [f"replicated {self.replicated:.1f}"] if round(self.replicated, 1) else []
        parts += [f"Engram {self.engram:.1f}"] if self.engram else []
        return f"{' + '.join(parts)} = {self.weights:.1f} GB"

    def text(self) -> str:
        return (f"weights {self.weights_text()}; KV for one {self.max_model_len}-token sequence {self.kv:.1f} GB "
                f"({self.kv_bytes_per_token:.0f} B/token); runtime reserve {self.reserve:g} GB; "
                f"total {self.total:.1f} GB")

    def max_len_that_fits(self, budget_gb: float) -> int:
        """The longest `max_model_len` whose KV still fits next to the weights and the reserve."""
        room = budget_gb - self.weights - self.reserve
        if room <= 0 or self.kv_bytes_per_token <= 0:
            return 0
        return int(room * GB / self.kv_bytes_per_token)


def classify(name: str) -> str:
    """experts / engram / replicated / dense for a checkpoint tensor name."""
    if _EXPERT.search(name):
        return "experts"
    if _ENGRAM_TABLE.search(name):
        return "engram"
    if _REPLICATED.search(name):
        return "replicated"
    return "dense"


def pp_partition(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) of every PP stage, as vLLM's `distributed/utils.py` `get_pp_indices` splits them (without
    VLLM_PP_LAYER_PARTITION): even split, the remainder on the stages before the last."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def stage_splits(tensor_bytes: dict[str, int], num_layers: int, pp: int) -> list[WeightSplit]:
    """Bytes per PP stage: decoder layers by index, the embedding (and vision tower) on the first stage,
    everything else (head, final norm, draft/MTP layers past `num_layers`) on the last."""
    bounds = pp_partition(num_layers, pp)
    totals = [{"experts": 0, "dense": 0, "replicated": 0, "engram": 0} for _ in range(pp)]
    for name, size in tensor_bytes.items():
        match = _LAYER.search(name)
        if match and int(match.group(2)) < num_layers:
            layer = int(match.group(2))
            stage = next(i for i, (lo, hi) in enumerate(bounds) if lo <= layer < hi)
        elif _FIRST_STAGE.search(name) and not match:
            stage = 0
        else:
            stage = pp - 1
        totals[stage][classify(name)] += size
    return [WeightSplit(t["experts"] / GB, t["dense"] / GB, t["replicated"] / GB, t["engram"] / GB) for t in totals]


def text_config(config: dict[str, object]) -> dict[str, object]:
    """V4.1's config.json nests the language model under `text_config` (vLLM flattens it:
    `transformers_utils/configs/deepseek_v41.py`)."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else dict(config)


def kv_ratios(config: dict[str, object]) -> tuple[int, ...] | None:
    """Compress ratio of every decoder layer from config.json (`layer_types` x `compress_rates`), as vLLM reads
    them (`max(1, compress_rates.get(layer_type, 0))`); None when the config does not say."""
    cfg = text_config(config)
    layers, types, rates = cfg.get("num_hidden_layers"), cfg.get("layer_types"), cfg.get("compress_rates")
    if not isinstance(layers, int) or not isinstance(types, list) or not isinstance(rates, dict):
        return None
    return tuple(max(1, int(rates.get(t, 0) or 0)) for t in types[:layers])


def kv_bytes_per_token(ratios: tuple[int, ...], dtype: str, head_dim: int = 512) -> float:
    """KV bytes one token costs on one GPU holding these layers."""
    state = FP8_DS_MLA_STATE_BYTES if dtype == "fp8_ds_mla" else head_dim * KV_ELEMENT_BYTES.get(dtype, 2)
    total = 0.0
    for ratio in ratios:
        if ratio > 1:
            total += state / ratio
        if ratio == 4:
            total += INDEXER_STATE_BYTES / ratio
    return total


MLA_FP8_DS_BYTES = 656
"""`fp8_ds_mla` packs NoPE + RoPE + scales into 656 bytes per token and layer (vLLM 0.33.0
model_executor/layers/attention/mla_attention.py:1386)."""


def gqa_kv_bytes_per_layer(kv_heads: int, tensor: int, head_dim: int, dtype: str) -> int:
    """K and V of one token in one layer on one GPU: 2 x KV heads per rank x head_dim x element bytes
    (v1/kv_cache_interface.py:586-594), KV heads per rank = max(1, total // TP) (config/model.py:1683)."""
    return 2 * max(1, kv_heads // tensor) * head_dim * KV_ELEMENT_BYTES.get(dtype, 2)


def mla_kv_bytes_per_layer(head: int, dtype: str) -> int:
    """MLA's latent (kv_lora_rank + qk_rope_head_dim) of one token in one layer, one KV head, not split over TP
    (config/model.py:1673-1675, `max_tp_shards=1` in mla_attention.py)."""
    return MLA_FP8_DS_BYTES if dtype == "fp8_ds_mla" else head * KV_ELEMENT_BYTES.get(dtype, 2)


def engram_dp_shards(data: int, local_ranks: list[int]) -> int:
    """vLLM's node-local Engram DP group: whole DP replicas that share a node, when every node holds as many
    (`_engram_dp_shard_size`: gcd of the DP size and the replicas per node, 1 when nodes differ)."""
    if not local_ranks or len(set(local_ranks)) != 1:
        return 1
    return math.gcd(data, local_ranks[0])


def gpu_memory(stage: WeightSplit, *, tensor: int, data: int, engram_on_gpu: bool, engram_shards: int,
               engram_copies_per_node: float, kv_per_token: float, max_model_len: int,
               reserve_gb: float = RUNTIME_RESERVE_GB, redundant_per_routed: float = 0.0) -> GpuMemory:
    """One GPU of the heaviest PP stage. `stage` holds that stage's whole weights (not yet split over GPUs);
    `kv_per_token` its layers' KV bytes per token; `engram_shards` = TP x the Engram DP group.
    `redundant_per_routed` = EPLB's redundant experts / routed experts: every EP rank holds (routed + redundant) /
    EP physical experts of one expert's size (fused_moe/layer.py `determine_expert_counts`, global = routed +
    redundant), so the redundant ones add that share of the routed experts' bytes."""
    engram_gpu = stage.engram_gb / engram_shards if engram_on_gpu else 0.0
    return GpuMemory(
        redundant_experts=stage.experts_gb * redundant_per_routed / (tensor * data),
        experts=stage.experts_gb / (tensor * data),
        dense=stage.dense_gb / tensor,
        replicated=stage.replicated_gb,
        engram=engram_gpu,
        kv=kv_per_token * max_model_len / GB,
        reserve=reserve_gb,
        engram_host_per_node=0.0 if engram_on_gpu else stage.engram_gb * engram_copies_per_node,
        max_model_len=max_model_len,
        kv_bytes_per_token=kv_per_token,
    )
