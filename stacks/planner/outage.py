"""How long the API is down while the whole engine group restarts, phase by phase, each figure with its source.

A group restart is: the old containers are removed (stop), every rank reads its weights (from the page cache where
the staged change warmed it, from disk where not), vLLM starts up on the GPUs (profile run, KV cache, JIT kernels,
CUDA graph capture), and the API check sees /health answer (checks). The plan (`model.outage`), `stacks diff` and
the engine-ready timeout floor (`estimated_load_s`) all read these phases; nothing else models the outage.

Two shapes of the same restart:

- `cold`: the ranks read from disk at `model.load_gb_per_s` per node (what a node does after a reboot, or when
  the staged warming could not hold the weights);
- `staged`: the program's staged steps (image pull, weights, dry run, page-cache warming, all while the old group
  serves) ran first, so each rank reads its tensors from the page cache; what the warming could not hold is read
  from disk as in `cold`. The plan uses it when it plans the warming (`page-cache-<node>` checks).

What a rank reads (vLLM 0.33.0, model_executor/model_loader/weight_utils.py:1243-1249,
`safetensors_weights_iterator`): it calls `f.get_tensor(name)` for every tensor of every shard, but safetensors'
`get_tensor` returns a view of the file's mmap, so a page is read only when the model's weight loader copies from
it: a TP slice (`narrow`), a local expert (a non-local one returns untouched: layers/fused_moe/routed_experts.py:
735-737), its rows of the Engram tables (a dim-0 `narrow`: models/deepseek_v41/common/engram.py:613), a replicated
weight whole (bench/default_loader_reads.py runs vLLM's own iterator: iterating copies and maps nothing, a copy's
time follows the bytes copied, docs/speed.md#outage-figures). The model counts what a rank copies
(stacks/planner/load_estimate.py `rank_copy_gb`): its experts, its Engram rows and the replicated weights as its GPU
holds them, and every dense weight whole rather than its TP slice (a slice on dim 1 maps the whole tensor), so the
page-cache phase is an upper bound. The cited rates are per byte a rank copies too (one copy of the cited run's
checkpoint split over its ranks). With `--enable-ep-weight-filter` (parallelism.ep_weight_filter) the iterator does
not even map the other ranks' experts (`should_skip_weight`; default_loader.py:426-450, off with EPLB): the same
bytes copied, less for the node's page cache to hold (`node_warm_gb`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from stacks.model.config import StackConfig
from stacks.planner.model_cards import ModelProfile
from stacks.planner.topology import NodeTopology, Topology

STOP_S = 5
STOP_SOURCE = ("the engine containers carry no `destroy_grace_seconds`, so the docker provider removes them "
               "without a stop attempt (pulumi_docker Container `destroy_grace_seconds`: \"If defined will attempt "
               "to stop the container before destroying\"); `docker rm -f` of a running engine container took "
               "under 1 s here (bench/container_stop.py, docs/speed.md), counted as 5 s for the GPUs' release")
PAGE_CACHE_RUN: dict[str, float] = {"checkpoint_gb": 688.6, "ranks": 8, "seconds": 22.6}
"""The cited warm load of vLLM's default loader (PAGE_CACHE_SOURCE): DeepSeek-R1 on one host of 8 H200, TP8 + EP8."""
PAGE_CACHE_GB_PER_S = 3.7
"""GB one rank of vLLM's default (one-thread) loader copies from the page cache to its GPU per second, 8 ranks per
host: the cited run's checkpoint split over its 8 ranks per second of its slowest rank, 688.6 / 8 / 22.6 = 3.81,
taken down to 3.7 as vLLM skips R1's MTP layer (14B of its 685B weights; vLLM 0.33.0 models/deepseek_v2.py:1653-1655)
and a replicated weight copied by every rank only adds to the ranks' bytes. The model applies it to every byte of the
checkpoint (an upper bound of what a rank copies), so the phase's seconds are an upper bound."""
PAGE_CACHE_SOURCE = (
    "cited, not measured here: InstantTensor's benchmark (github.com/scitix/InstantTensor docs/benchmark.md, "
    "'Test on in-memory file system (tmpfs)', linked from vLLM's docs models/extensions/instanttensor.md) loaded "
    "DeepSeek-R1 (688.6 GB of safetensors) with vLLM's default safetensors loader on one host of 8 H200, TP=8 "
    "EP=8, from tmpfs (memory, as a warm page cache) in 22.6 s to the slowest GPU; 1 H200 loaded Qwen3-30B-A3B "
    "(61.07 GB, every byte) in 12.7 s, 4.81 GB/s. A rank copies only its share (safetensors' get_tensor is an mmap "
    "view: bench/default_loader_reads.py), so R1's 8 ranks moved one copy between them: 688.6 GB / 8 / 22.6 s = "
    "3.8 GB/s per rank with 8 ranks per host, taken as 3.7 (vLLM skips R1's MTP layer, about 2 %) and applied to "
    "what a rank copies: its experts, its Engram rows and the replicated weights as its GPU holds them, and every "
    "dense weight whole rather than its TP slice (an upper bound: a slice on dim 1 maps the whole tensor, "
    "bench/default_loader_reads.py)")
MULTITHREAD_RUN: dict[str, float] = {"checkpoint_gb": 158.0, "ranks": 2, "seconds": 39.82}
"""The cited warm load of vLLM's multi-thread loader (MULTITHREAD_SOURCE): its slower run, TP=2 + EP, 2 ranks."""
MULTITHREAD_GB_PER_S = 1.9
"""GB one rank of vLLM's multi-thread loader copies from the page cache per second, counted as PAGE_CACHE_GB_PER_S
is: the cited run's checkpoint split over its 2 ranks per second of a rank, 158 / 2 / 39.82 = 1.98, taken down to
1.9. The model applies it to what a rank copies, as it does the default loader's rate."""
MULTITHREAD_SOURCE = (
    "cited, not measured here: vllm-project/vllm-omni#4896 (2026-07-06) loaded a 158 GB, 32-shard safetensors "
    "checkpoint 99.9 % resident in the page cache (vmtouch) with vLLM's multi-thread iterator "
    "(`multi_thread_safetensors_weights_iterator`, 'Multi-thread loading shards', 4 threads; vLLM 0.24.0), TP=2 + EP "
    "on PCIe Gen5 GPUs: 25.43 s per rank at best, 39.82 s on the day's first run. Its `load_file` returns mmap "
    "views too (bench/default_loader_reads.py --modes multithread-none), so its 2 ranks copied one copy between "
    "them: 158 GB / 2 / 39.82 s = 1.98 GB/s per rank, taken as 1.9 and applied to what a rank copies, counted "
    "as the default loader's 3.7 GB/s is. No source cited here shows it faster than the default loader from a warm "
    "page cache (vllm-project/vllm#23928, which added it: 'In the case of PageCache, it can slightly reduce "
    "loading time'). Each rank reads every shard in that iterator (no EP filter: vLLM 0.33.0 "
    "model_loader/default_loader.py:329-336)")
MULTITHREAD_HINT = ("serving.model_loader_extra_config: {enable_multithread_load: true} (vLLM 0.33.0 "
                    "model_loader/default_loader.py:103-143: up to 8 threads read shards in parallel)")


def multithread_load(argv: list[str] | None) -> bool:
    """Does this argv turn on vLLM's multi-thread weight loader (`--model-loader-extra-config
    '{"enable_multithread_load": true}'`, vLLM 0.33.0 default_loader.py:117, 329)? The last value counts, as in
    argparse; a value that is no JSON object is not (vLLM refuses it: default_loader.py:98-102)."""
    import json

    words = list(argv or [])
    found: object = None
    for i, word in enumerate(words):
        if word == "--model-loader-extra-config" and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith("--model-loader-extra-config="):
            found = word.split("=", 1)[1]
    if not isinstance(found, str):
        return False
    try:
        value = json.loads(found)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("enable_multithread_load") is True


DISK_SOURCE = ("model.load_gb_per_s: the stack's figure for one node reading its share from disk, parsing "
               "included; the default 0.1 is an assumption (no measurement of a prod node: measure yours with "
               "bench/page_cache_load.py's cold row and set it)")
STARTUP_S = 480
"""From the start of the engine processes until vLLM serves, less nothing: the cited run's whole start-up, its own
weight load included (it reports no load time to take off). What runs after the weights in vLLM 0.33.0, per rank
and in parallel: the profile run (v1/worker/gpu_worker.py:700), the CUDA graph memory profile (:717), the KV cache
(v1/engine/core.py:321, 372), the kernel warm-up with DeepGEMM's JIT warm-up and FlashInfer's autotune
(gpu_worker.py:982; model_executor/warmup/kernel_warmup.py:242-272) and the CUDA graph capture (gpu_worker.py:994);
no torch.compile for the DeepSeek V4/V4.1 models (config/vllm.py:869). No source gives those parts for this model
on Hopper, so the phase is the one whole figure (STARTUP_SOURCE)."""
STARTUP_SOURCE = (
    "cited, not measured here: vllm-project/vllm#43189 (2026-05-20), DeepSeek-V4-Flash on one node of 8 H20 "
    "(Hopper, as prod's H100), TP=8 + EP, fp8 KV cache: 'the time from process start to \"service ready\" is "
    "approximately 8 minutes' (480 s). Counted whole, its weight load included, as the margin for what prod adds "
    "to that run: the DSpark drafter's graphs, a DP group over two nodes, a 1M-token context. Parts cited: CUDA "
    "graph capture 22 s for DeepSeek-V4-Flash on Ampere (vllm-project/vllm#50576, 'Graph capturing finished in 22 "
    "secs'); "
    "DeepGEMM's warm-up ran 1346 cases for DeepSeek-V4-Flash on 8 H20, TP=8 (vllm-project/vllm#53320); the V4/V4.1 "
    "models are not torch.compiled in vLLM 0.33.0 (vllm/config/vllm.py:869 `CompilationMode.NONE`)")
CHECKS_S = 5
CHECKS_SOURCE = "the API check polls /health at most every 5 s (checks/api.py `wait_health`)"


@dataclass(frozen=True)
class Phase:
    name: str
    """stop, load-page-cache, load-disk, start-up, checks"""
    seconds: int
    figure: str
    """how the seconds follow from the figure, e.g. '31.9 GB per rank at 1.0 GB/s'"""
    source: str


@dataclass(frozen=True)
class Outage:
    kind: str
    """cold or staged"""
    phases: tuple[Phase, ...]
    warm_gb_per_node: float
    """What the staged warming reads into the page cache on the busiest node (0 when cold)."""

    @property
    def total_s(self) -> int:
        return sum(p.seconds for p in self.phases)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "total_s": self.total_s, "warm_gb_per_node": round(self.warm_gb_per_node, 1),
                "phases": [asdict(p) for p in self.phases]}


def _weights(config: StackConfig, profile: ModelProfile) -> tuple[float, float]:
    """(all weights, of which routed experts) in GB, at `model.weights_gb` when set."""
    split = profile.weight_split
    total = config.model.weights_gb or profile.weights_gb
    share = split.experts_gb / split.total_gb if split.total_gb else 0.0
    return total, total * share


def ep_filtered(config: StackConfig) -> bool:
    """Does vLLM skip the other ranks' experts before reading them (default_loader.py:426-450)?"""
    par = config.parallelism
    return bool(par.expert and par.ep_weight_filter and not par.eplb.enabled)


def node_warm_gb(config: StackConfig, profile: ModelProfile, topo: Topology, multithread: bool = False) -> float:
    """What the busiest node's ranks read together, i.e. what its page cache must hold: every file, or with the
    filter (default loader only) the non-expert weights plus the experts of its ranks."""
    total, experts = _weights(config, profile)
    if multithread or not ep_filtered(config):
        return total
    par = config.parallelism
    ranks = max(n.gpus_used for n in topo.nodes)
    return total - experts + experts * ranks / (par.data * par.tensor)


def warm_experts(config: StackConfig, profile: ModelProfile, node: NodeTopology) -> str | None:
    """`checks.page_cache --experts N:EP:FIRST-LAST` for a node whose ranks skip the other ranks' experts (mp, one
    PP stage: EP rank = DP rank x TP + TP rank, vLLM 0.33.0 default_loader.py:467-471); None: every byte."""
    par = config.parallelism
    if not ep_filtered(config) or par.backend != "mp" or par.pipeline > 1 or not node.dp_ranks \
            or not profile.routed_experts:
        return None
    first, last = node.dp_ranks[0] * par.tensor, (node.dp_ranks[-1] + 1) * par.tensor - 1
    return f"{profile.routed_experts}:{par.data * par.tensor}:{first}-{last}"


def disk_share_gb(config: StackConfig, profile: ModelProfile, topo: Topology) -> float:
    """The busiest node's share of the weights: its GPUs' share of one copy (what `model.load_gb_per_s` is
    calibrated on)."""
    par = config.parallelism
    shards = par.tensor * par.pipeline * (par.data if par.expert else 1)
    return max(n.gpus_used for n in topo.nodes) * (config.model.weights_gb or profile.weights_gb) / shards


def _common(load: list[Phase]) -> tuple[Phase, ...]:
    return (Phase("stop", STOP_S, "the group's containers removed", STOP_SOURCE), *load,
            Phase("start-up", STARTUP_S, "after the weights, per rank in parallel", STARTUP_SOURCE),
            Phase("checks", CHECKS_S, "until the API check sees /health 200", CHECKS_SOURCE))


def cold_outage(config: StackConfig, profile: ModelProfile, topo: Topology) -> Outage:
    share = disk_share_gb(config, profile, topo)
    rate = config.model.load_gb_per_s
    load = Phase("load-disk", math.ceil(share / rate), f"{share:.1f} GB per node at {rate:g} GB/s", DISK_SOURCE)
    return Outage("cold", _common([load]), 0.0)


def staged_outage(config: StackConfig, profile: ModelProfile, topo: Topology, rank_gb: float,
                  spare_gb: float | None = None, multithread: bool = False) -> Outage:
    """The restart after the staged warming. `rank_gb`: what one rank copies from the page cache
    (load_estimate.rank_copy_gb). `spare_gb`: what the busiest node's page cache can hold beside the running engine
    (MemAvailable less its pinned host memory); None: assumed to hold the whole working set (the warming step
    reports what it warmed on every run)."""
    warm_need = node_warm_gb(config, profile, topo, multithread)
    warm = warm_need if spare_gb is None else max(0.0, min(warm_need, spare_gb))
    held = warm / warm_need if warm_need else 1.0
    per_rank = rank_gb
    assumption = "" if spare_gb is not None else "; assumes the node's page cache holds all of it"
    rate, source = (MULTITHREAD_GB_PER_S, MULTITHREAD_SOURCE) if multithread else (PAGE_CACHE_GB_PER_S,
                                                                                    PAGE_CACHE_SOURCE)
    loader = "the multi-thread loader" if multithread else "the default loader"
    load = [Phase("load-page-cache", math.ceil(per_rank * held / rate),
                  f"{per_rank * held:.1f} GB per rank at {rate:g} GB/s ({loader}), ranks in parallel "
                  f"({warm:.1f} of {warm_need:.1f} GB per node warmed{assumption})", source)]
    if held < 1.0:
        rest = disk_share_gb(config, profile, topo) * (1.0 - held)
        rate = config.model.load_gb_per_s
        load.append(Phase("load-disk", math.ceil(rest / rate),
                          f"{rest:.1f} GB per node not warmed, at {rate:g} GB/s", DISK_SOURCE))
    return Outage("staged", _common(load), warm)


def engine_ready_floor_s(config: StackConfig, profile: ModelProfile, topo: Topology) -> int:
    """From the start of the containers until the engines serve, read cold: the floor for the engine-ready
    timeout (a reboot reads from disk whatever the staging did)."""
    return sum(p.seconds for p in cold_outage(config, profile, topo).phases if p.name in ("load-disk", "start-up"))


def outage_plan(config: StackConfig, profile: ModelProfile, topo: Topology, staged: bool, rank_gb: float,
                argv: list[str] | None = None) -> dict[str, Any]:
    """`plan --json`'s `model.outage`: the restart the program performs (`applies`) and the other one. `argv`: the
    head's rendered `vllm serve` words (which loader the ranks run). Where the default loader runs and the multi-thread
    one would model shorter (both rates counted per byte a rank copies), `faster` says what the staged restart would
    take with it, and how to turn it on; with the cited rates it never does."""
    cold = cold_outage(config, profile, topo)
    multithread = multithread_load(argv)
    warm = staged_outage(config, profile, topo, rank_gb, multithread=multithread)
    out: dict[str, Any] = {"applies": "staged" if staged else "cold", "cold": cold.as_dict(),
                           "staged": warm.as_dict()}
    if not multithread:
        faster = staged_outage(config, profile, topo, rank_gb, multithread=True)
        if faster.total_s < warm.total_s:
            out["faster"] = {"total_s": faster.total_s, "how": MULTITHREAD_HINT, "staged": faster.as_dict()}
    return out
