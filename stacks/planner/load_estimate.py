"""How long a node needs to load its share of the weights (the floor for the engine-ready timeout), and the
memory model of `stacks.planner.memory` applied to a stack config (what one GPU must hold).

The load time is the cold restart's load and start-up phases of `stacks.planner.outage` (one model of the outage,
its figures and their sources there): the busiest node's share of one copy at `model.load_gb_per_s` (default 0.1
GB/s, an assumption: the field reports give no load time), plus the cited start-up. The memory model below is
the finer split (experts over DP x TP, dense and Engram per DP rank).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stacks.model.config import StackConfig
from stacks.planner.image_capabilities import get_capabilities
from stacks.planner.memory import (
    GpuMemory,
    WeightSplit,
    engram_dp_shards,
    gpu_memory,
    gqa_kv_bytes_per_layer,
    kv_bytes_per_token,
    mla_kv_bytes_per_layer,
    pp_partition,
)
from stacks.planner.model_cards import ModelProfile
from stacks.planner.outage import engine_ready_floor_s
from stacks.planner.serve_options import option_table, read_argv
from stacks.planner.topology import Topology

DEFAULT_BATCHED_TOKENS = 2048
"""vLLM 0.33.0's max_num_batched_tokens when the stack leaves it unset (create_engine_config on a GPU-less host)."""


def weight_shards(config: StackConfig) -> int:
    """Experts spread over EP = DP x TP; without EP every DP replica holds the whole model on TP x PP GPUs."""
    par = config.parallelism
    return par.tensor * par.pipeline * (par.data if par.expert else 1)


def weights_per_gpu_gb(config: StackConfig, profile: ModelProfile) -> float:
    return (config.model.weights_gb or profile.weights_gb) / weight_shards(config)


def estimated_load_s(config: StackConfig, profile: ModelProfile, topo: Topology) -> int:
    """The slowest node, read cold: its GPUs' share of the weights at the load rate, plus start-up."""
    return engine_ready_floor_s(config, profile, topo)


@dataclass(frozen=True)
class EngineMemory:
    """The memory model of `stacks.planner.memory` applied to a stack: what one GPU of the smallest node must hold."""

    gpu: GpuMemory
    gpu_gb: float
    budget_gb: float
    node_index: int
    engram_on_gpu: bool
    engram_reason: str
    engram_shards: int
    engram_copies_per_node: float
    stages: tuple[GpuMemory, ...] = ()
    """One GPU of every PP stage; `gpu` is the heaviest."""


def engram_on_gpu(config: StackConfig) -> tuple[bool, str]:
    """Where the Engram tables live: an explicit `--engram-config` cpu_offload in serving.extra_args, else the
    image's default from stacks/planner/image_capabilities.py, else (unknown image) GPU memory, the safe assumption."""
    offload = _engram_offload_arg(config.serving.extra_args)
    if offload is not None:
        return not offload, f"--engram-config cpu_offload={str(offload).lower()} in serving.extra_args"
    caps = get_capabilities(config.image.ref)
    if caps is not None and caps.engram_cpu_offload is not None:
        where = "pinned host memory" if caps.engram_cpu_offload else "GPU memory"
        return not caps.engram_cpu_offload, f"image {config.image.ref} keeps them in {where} by default"
    return True, (f"not known where image {config.image.ref} keeps them: counted in GPU memory (add "
                  "--engram-config '{\"cpu_offload\": true}' to serving.extra_args to offload them)")


def _engram_offload_arg(args: list[str]) -> bool | None:
    """`cpu_offload` as vLLM would read it from `--engram-config` in extra_args: any spelling (`_`, a unique
    prefix, `=`), the JSON form or the dotted `--engram-config.cpu_offload` form. A repeated option is refused by
    the managed-options guard (vLLM keeps the last and merges dotted forms after the JSON), so one occurrence is
    read here. None: not set there (the image's default applies), or not readable (the dry run decides)."""
    for item in read_argv(list(args), option_table("0.33.0")):
        if item.dest != "engram_config" or not item.values:
            continue
        name = item.word.partition("=")[0].replace("_", "-")
        value = item.values[-1]
        if "." in name:
            path = name.split(".", 1)[1]
            return value.lower() == "true" if path == "cpu-offload" and value.lower() in ("true", "false") else None
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        if isinstance(parsed, dict) and isinstance(parsed.get("cpu_offload"), bool):
            return bool(parsed["cpu_offload"])
        return None
    return None


def local_dp_ranks(config: StackConfig, topo: Topology) -> list[int]:
    """DP ranks per node (mp); one replica spans the nodes with ray."""
    if config.parallelism.backend == "ray":
        return [1] * len(config.nodes)
    return [n.dp_local or 0 for n in topo.nodes] or [1]


def stage_weights(profile: ModelProfile, pipeline: int, total_gb: float | None) -> list[WeightSplit]:
    """The whole weights of every PP stage: from the card's per-layer bytes (decoder layers as vLLM's
    get_pp_indices splits them, the embedding on the first stage, head and final norm on the last), or equal
    shares where the card's split is assumed. `model.weights_gb` rescales them."""
    split = profile.weight_split
    scale = total_gb / split.total_gb if total_gb and split.total_gb else 1.0
    if profile.layer_split is None or len(profile.layer_split) < pipeline:
        share = (split.scaled(total_gb) if total_gb else split).divided(pipeline)
        return [share] * pipeline
    stages = []
    for i, (lo, hi) in enumerate(pp_partition(len(profile.layer_split), pipeline)):
        cols = [sum(layer[c] for layer in profile.layer_split[lo:hi]) for c in range(4)]
        for extra, on in ((profile.first_stage, i == 0), (profile.last_stage, i == pipeline - 1)):
            if on:
                cols = [a + b for a, b in zip(cols, extra, strict=True)]
        stages.append(WeightSplit(*(c * scale for c in cols)))
    return stages


def _round_up(value: int, to: int) -> int:
    return -(-value // to) * to


def mxfp4_padding(profile: ModelProfile, config: StackConfig) -> float:
    """How much larger vLLM allocates MXFP4 experts than the checkpoint holds them: the kernels want the hidden size
    a multiple of 256 and each rank's FFN slice a multiple of 128 (the Marlin and TRT-LLM backends, the largest
    NVIDIA alignments in fused_moe/oracle/mxfp4.py:837-917, `mxfp4_round_up_hidden_size_and_intermediate_size`;
    which backend runs depends on the GPU, so the largest is counted)."""
    if profile.mxfp4_experts is None:
        return 1.0
    hidden, ffn = profile.mxfp4_experts
    par = config.parallelism
    shards = 1 if par.expert else par.tensor * (par.data if par.backend == "mp" else 1)
    part = max(1, ffn // shards)
    return _round_up(hidden, 256) / hidden * _round_up(part, 128) / part


def stage_kv_per_token(profile: ModelProfile, config: StackConfig) -> list[float]:
    """KV bytes one token costs on one GPU of each PP stage, by attention type. Sliding-window layers hold at most
    window + one step's tokens of a sequence, so they count that share of a max_model_len sequence."""
    par, serving = config.parallelism, config.serving
    dtype = serving.kv_cache_dtype or profile.default_kv_cache_dtype
    if profile.family == "deepseek-v4":
        return [kv_bytes_per_token(profile.kv_ratios[lo:hi], dtype)
                for lo, hi in pp_partition(len(profile.kv_ratios), par.pipeline)]
    if profile.mla_head is not None:
        per_layer = float(mla_kv_bytes_per_layer(profile.mla_head, dtype))
    else:
        per_layer = float(gqa_kv_bytes_per_layer(profile.kv_heads, par.tensor, profile.head_dim, dtype))
    length = serving.max_model_len
    window = profile.sliding_window or 0
    held = min(length, window + (serving.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS)) / length
    out = []
    for lo, hi in pp_partition(profile.layers, par.pipeline):
        slides = profile.sliding_layers[lo:hi] if profile.sliding_layers else ()
        n_slide = sum(1 for x in slides if x)
        out.append(per_layer * ((hi - lo - n_slide) + n_slide * held))
    return out


def redundant_per_routed(config: StackConfig, profile: ModelProfile) -> float:
    """EPLB's redundant experts per routed expert (0 without EPLB or EP): what they add to a rank's expert bytes."""
    par = config.parallelism
    redundant = par.eplb.num_redundant_experts if par.eplb.enabled and par.expert else 0
    return redundant / profile.routed_experts if profile.routed_experts else 0.0


def engine_memory(config: StackConfig, profile: ModelProfile, topo: Topology) -> EngineMemory:
    """Per GPU of the node with the smallest GPUs, on the heaviest PP stage."""
    par, serving = config.parallelism, config.serving
    on_gpu, reason = engram_on_gpu(config)
    caps = get_capabilities(config.image.ref)
    local = [n for n in local_dp_ranks(config, topo) if n > 0] or [1]
    data = par.data if par.backend == "mp" else 1
    edp = data if caps is not None and caps.engram_shards_across_dp else engram_dp_shards(data, local)
    pad = mxfp4_padding(profile, config)
    stages = [WeightSplit(s.experts_gb * pad, s.dense_gb, s.replicated_gb, s.engram_gb)
              for s in stage_weights(profile, par.pipeline, config.model.weights_gb)]
    kv = stage_kv_per_token(profile, config)
    # mp keeps a DP rank's PP stages on one node; with ray each node is (about) one stage.
    copies = max(local) / edp * (par.pipeline if par.backend == "mp" else 1)

    per_routed = redundant_per_routed(config, profile)

    def at(i: int, kv_per_token: float) -> GpuMemory:
        return gpu_memory(stages[i], tensor=par.tensor, data=data, engram_on_gpu=on_gpu,
                          engram_shards=par.tensor * edp, engram_copies_per_node=copies, kv_per_token=kv_per_token,
                          max_model_len=serving.max_model_len, redundant_per_routed=per_routed)

    gpus = [at(i, kv[i]) for i in range(par.pipeline)]
    # equal weight shares (an assumed split): the stage with the most KV decides
    gpu = at(0, max(kv)) if profile.layer_split is None else max(gpus, key=lambda g: g.total)
    index = min(range(len(config.nodes)), key=lambda i: config.nodes[i].gpus.memory_gb)
    gpu_gb = config.nodes[index].gpus.memory_gb
    return EngineMemory(gpu=gpu, gpu_gb=gpu_gb, budget_gb=gpu_gb * serving.gpu_memory_utilization, node_index=index,
                        engram_on_gpu=on_gpu, engram_reason=reason, engram_shards=par.tensor * edp,
                        engram_copies_per_node=copies, stages=tuple(gpus))


def rank_copy_gb(config: StackConfig, profile: ModelProfile, topo: Topology) -> float:
    """What one rank of the heaviest PP stage copies from the page cache while vLLM 0.33.0 loads, at most: its
    experts as its GPU holds them (1/EP, EPLB's redundant copies included; under TP alone, or with Ray, where the
    planner divides by TP only, more), its rows of the Engram tables (a dim-0 narrow, models/deepseek_v41/common/
    engram.py:613; tables kept in host memory are filled by one rank per node-local DP group, engram.py:860-867,
    so that rank is counted with its TP shard's whole table), the replicated weights, and every dense weight whole,
    not its TP slice (a slice on dim 1 maps the whole tensor, bench/default_loader_reads.py). A non-local expert is
    returned untouched (layers/fused_moe/routed_experts.py:735-737) and iterating the shards maps nothing, so the
    rest of the checkpoint is not read by this rank. Except: `--safetensors-load-strategy eager` reads every file
    whole on every rank (model_loader/weight_utils.py:1207-1209), and `prefetch` first reads this rank's 1/world
    of the files (weight_utils.py:1057, counted on top). Not counted: the vision tower's weights, which a
    vision-language DeepSeek copies whole on every rank (small beside the experts), and the per-tensor cost of
    iterating every shard's names (inside the cited rate's run, which iterated R1's whole checkpoint too)."""
    par = config.parallelism
    total = config.model.weights_gb or profile.weights_gb
    strategy = config.serving.safetensors_load_strategy
    if strategy == "eager":
        return float(total)
    mem = engine_memory(config, profile, topo)
    data = par.data if par.backend == "mp" else 1
    per_routed = redundant_per_routed(config, profile)
    out = 0.0
    for stage in stage_weights(profile, par.pipeline, config.model.weights_gb):
        experts = stage.experts_gb / (par.tensor * data) * (1 + per_routed) if par.expert else stage.experts_gb
        engram = stage.engram_gb / (mem.engram_shards if mem.engram_on_gpu else par.tensor)
        out = max(out, experts + stage.dense_gb + stage.replicated_gb + engram)
    if strategy == "prefetch":
        out += total / (par.tensor * par.pipeline * par.data)
    return out


def memory_table(config: StackConfig, profile: ModelProfile, topo: Topology) -> list[dict[str, Any]]:
    """`plan --json`'s `memory`: one entry per node, for one of its GPUs on the heaviest PP stage it holds."""
    par = config.parallelism
    per_stage = engine_memory(config, profile, topo).stages
    rows = []
    for i, node in enumerate(config.nodes):
        if par.backend == "ray" and par.pipeline > 1:
            held = sorted({min(par.pipeline - 1, i * par.pipeline // len(config.nodes))})
        else:
            held = list(range(par.pipeline))
        gpu = max((per_stage[s] for s in held), key=lambda g: g.total)
        usable = node.gpus.memory_gb * config.serving.gpu_memory_utilization
        rows.append({
            "node": node.name, "gpu_memory_gb": node.gpus.memory_gb, "usable_gb": round(usable, 2),
            "weights_gb": round(gpu.weights, 2),
            "weights_split_gb": {"experts": round(gpu.experts, 2), "dense": round(gpu.dense, 2),
                                 "replicated": round(gpu.replicated, 2), "engram": round(gpu.engram, 2),
                                 # only with EPLB's redundant experts, so other stacks' plans stay as they were
                                 **({"redundant_experts": round(gpu.redundant_experts, 2)}
                                    if gpu.redundant_experts else {})},
            "pp_stages": held, "kv_bytes_per_token": round(gpu.kv_bytes_per_token, 1),
            "kv_one_sequence_gb": round(gpu.kv, 2), "reserve_gb": gpu.reserve, "total_gb": round(gpu.total, 2),
            "free_for_kv_gb": round(usable - gpu.total, 2)})
    return rows
