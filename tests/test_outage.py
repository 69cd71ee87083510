"""The outage model (stacks/planner/outage.py): one set of phases feeds the plan, `stacks diff` and the
engine-ready timeout floor; the bytes each rank reads follow vLLM 0.33.0's loader."""

from __future__ import annotations

import copy
import math

import pytest

from review.downtime import downtime_of, phase_lines
from review.plan_diff import diff_plans, to_markdown
from review.replacement import duration
from stacks.model.config import StackConfig
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner import outage as outage_model
from stacks.planner.load_estimate import engine_memory, rank_copy_gb, stage_weights
from stacks.planner.model_cards import ModelProfile, get_profile
from stacks.planner.outage import (
    CHECKS_S,
    MULTITHREAD_GB_PER_S,
    MULTITHREAD_RUN,
    MULTITHREAD_SOURCE,
    PAGE_CACHE_GB_PER_S,
    PAGE_CACHE_RUN,
    PAGE_CACHE_SOURCE,
    STARTUP_S,
    STARTUP_SOURCE,
    STOP_S,
    Outage,
    cold_outage,
    multithread_load,
    node_warm_gb,
)
from stacks.planner.outage import staged_outage as _staged_outage
from stacks.planner.plan import build_plan
from stacks.planner.topology import Topology, derive_topology
from tests.conftest import ROOT


def staged_outage(config: StackConfig, profile: ModelProfile, topo: Topology, spare_gb: float | None = None,
                  multithread: bool = False) -> Outage:
    """The staged restart with what a rank copies, as the plan computes it."""
    return _staged_outage(config, profile, topo, rank_copy_gb(config, profile, topo), spare_gb, multithread)


def _stack(name: str, **parallelism: object) -> tuple[StackConfig, ModelProfile, Topology]:
    values = copy.deepcopy(read_stack_values(name))
    values.setdefault("parallelism", {}).update(parallelism)
    config = parse_config(name, values)
    topo, _ = derive_topology(config)
    profile = get_profile(config.model.profile)
    assert profile is not None
    return config, profile, topo


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_the_ready_floor_is_the_cold_restarts_load_and_start_up(stack: str) -> None:
    config, profile, topo = _stack(stack)
    plan = build_plan(stack, config)
    cold = cold_outage(config, profile, topo)
    by_name = {p.name: p.seconds for p in cold.phases}
    assert [p.name for p in cold.phases] == ["stop", "load-disk", "start-up", "checks"]
    assert plan.model["estimated_load_s"] == by_name["load-disk"] + by_name["start-up"]
    assert plan.model["outage"]["cold"]["total_s"] == sum(by_name.values())
    assert all(p["source"] for side in ("cold", "staged") for p in plan.model["outage"][side]["phases"])


def test_a_rank_copies_its_experts_and_engram_rows_and_every_dense_weight_whole() -> None:
    """prod (DP2 x TP8, EP16): a rank copies 1/16 of the experts, its Engram rows (dim-0 slices), the replicated
    weights and the dense weights whole (an upper bound of its TP slices); the node's page cache holds every file."""
    config, profile, topo = _stack("prod")
    total = config.model.weights_gb or profile.weights_gb
    (stage,) = stage_weights(profile, 1, config.model.weights_gb)
    shards = engine_memory(config, profile, topo).engram_shards
    expected = stage.experts_gb / 16 + stage.dense_gb + stage.replicated_gb + stage.engram_gb / shards
    assert rank_copy_gb(config, profile, topo) == pytest.approx(expected)
    assert 0.1 * total < rank_copy_gb(config, profile, topo) < 0.2 * total
    assert node_warm_gb(config, profile, topo) == total
    # under TP alone every rank copies every expert (its TP slices, counted whole)
    dense_tp, dense_profile, dense_topo = _stack("prod", expert=False)
    assert rank_copy_gb(dense_tp, dense_profile, dense_topo) == pytest.approx(
        stage.experts_gb + stage.dense_gb + stage.replicated_gb + stage.engram_gb
        / engine_memory(dense_tp, dense_profile, dense_topo).engram_shards)


def test_prods_rank_copies_75_8_gb_by_the_cards_own_numbers() -> None:
    """Worked from models/deepseek-v4.1-flash.json's split, not from the code's formula: experts 275.5 GB over
    EP16, dense 28.3 whole, replicated 5.0, Engram 202.2 over TP8 (on the GPU, one DP rank per node)."""
    config, profile, topo = _stack("prod")
    assert rank_copy_gb(config, profile, topo) == pytest.approx(275.5 / 16 + 28.3 + 5.0 + 202.2 / 8, abs=0.05)


@pytest.mark.parametrize("strategy", ["eager", "prefetch"])
def test_a_load_strategy_that_reads_whole_files_copies_more(strategy: str) -> None:
    """`eager` reads every file whole on every rank (vLLM 0.33.0 weight_utils.py:1207-1209); `prefetch` reads its
    1/world of the files first (weight_utils.py:1057): the restart models longer."""
    values = copy.deepcopy(read_stack_values("prod"))
    values["serving"]["safetensors_load_strategy"] = strategy
    config = parse_config("prod", values)
    topo, _ = derive_topology(config)
    profile = get_profile(config.model.profile)
    assert profile is not None
    plain = _stack("prod")
    total = config.model.weights_gb or profile.weights_gb
    copied = rank_copy_gb(config, profile, topo)
    if strategy == "eager":
        assert copied == total
    else:
        assert copied == pytest.approx(rank_copy_gb(*plain) + total / 16)
    assert staged_outage(config, profile, topo).total_s > staged_outage(*plain).total_s
    assert build_plan("prod", config).model["outage"]["staged"]["total_s"] == staged_outage(config, profile,
                                                                                            topo).total_s


def test_host_engram_tables_shared_by_a_nodes_dp_ranks_are_filled_by_one_rank() -> None:
    """examples/Pulumi.wide-ep.yaml (TP1 x DP16, 8 DP ranks per node, tables in host memory shared by the node's
    DP group): the writing rank copies its TP shard's whole table (vLLM 0.33.0 engram.py:860-867), 202.2 GB, not
    a sixteenth of it; its experts are 1/16 of the 256 routed plus EPLB's 16 redundant ones."""
    from stacks.model.stack_file import parse_stack_text

    text = (ROOT / "examples" / "Pulumi.wide-ep.yaml").read_text()
    config = parse_config("wide-ep", parse_stack_text(text, "Pulumi.wide-ep.yaml").values)
    topo, _ = derive_topology(config)
    profile = get_profile(config.model.profile)
    assert profile is not None and not engine_memory(config, profile, topo).engram_on_gpu
    assert rank_copy_gb(config, profile, topo) == pytest.approx(275.5 / 16 * (1 + 16 / 256) + 28.3 + 5.0 + 202.2,
                                                                abs=0.05)


def test_the_ep_filter_leaves_less_to_warm_and_the_same_to_copy() -> None:
    """`--enable-ep-weight-filter` keeps a rank from mapping the other ranks' experts, which it would not have
    copied anyway: the node warms less, a rank copies the same bytes, the restart models the same."""
    config, profile, topo = _stack("prod", ep_weight_filter=True)
    total = config.model.weights_gb or profile.weights_gb
    experts = total * profile.weight_split.experts_gb / profile.weight_split.total_gb
    ep = config.parallelism.data * config.parallelism.tensor
    ranks = max(n.gpus_used for n in topo.nodes)
    assert node_warm_gb(config, profile, topo) == pytest.approx(total - experts + experts * ranks / ep)
    plain = _stack("prod")
    assert rank_copy_gb(config, profile, topo) == pytest.approx(rank_copy_gb(*plain))
    assert staged_outage(config, profile, topo).total_s == staged_outage(*plain).total_s


def test_what_the_page_cache_cannot_hold_is_read_from_disk() -> None:
    config, profile, topo = _stack("prod")
    need = node_warm_gb(config, profile, topo)
    whole = staged_outage(config, profile, topo)
    assert [p.name for p in whole.phases] == ["stop", "load-page-cache", "start-up", "checks"]
    half = staged_outage(config, profile, topo, spare_gb=need / 2)
    assert half.warm_gb_per_node == pytest.approx(need / 2)
    names = [p.name for p in half.phases]
    assert names == ["stop", "load-page-cache", "load-disk", "start-up", "checks"]
    disk = next(p for p in half.phases if p.name == "load-disk")
    cold_disk = next(p for p in cold_outage(config, profile, topo).phases if p.name == "load-disk")
    assert disk.seconds == pytest.approx(cold_disk.seconds / 2, abs=1)
    nothing = staged_outage(config, profile, topo, spare_gb=0)
    assert nothing.warm_gb_per_node == 0
    assert next(p for p in nothing.phases if p.name == "load-disk").seconds == cold_disk.seconds


def test_stacks_diff_of_an_image_change_gives_the_phases_with_their_sources() -> None:
    head = build_plan("prod", parse_config("prod", read_stack_values("prod"))).to_json_dict()
    base = copy.deepcopy(head)
    for node in base["nodes"]:
        for container in node["containers"]:
            container["image"] = "vllm/vllm-openai:older"
            container["labels"]["vllm-cluster.generation"] = "older"
    found = diff_plans("prod", "main", base, head)
    outage = head["model"]["outage"]
    applied = outage[outage["applies"]]
    assert found["outage"]["head"] == applied
    text = downtime_of(found)
    minutes, seconds = divmod(applied["total_s"], 60)
    assert f"down about {minutes} min {seconds} s" in text
    lines = phase_lines(found)
    markdown = to_markdown(found)
    for phase, line in zip(applied["phases"], lines, strict=True):
        assert line in markdown and phase["source"] in line and phase["figure"] in line
    # counted per byte a rank copies, the multi-thread loader is no shorter: no line offers it
    assert "faster" not in outage and "faster" not in found["outage"]["head"]
    assert len(lines) == len(applied["phases"]) and "multi-thread" not in markdown


MULTITHREAD = ["--model-loader-extra-config", '{"enable_multithread_load": true, "num_threads": 8}']


@pytest.mark.parametrize(("argv", "on"), [
    ([], False),
    (MULTITHREAD, True),
    (["--model-loader-extra-config={\"enable_multithread_load\": true}"], True),
    (["--model-loader-extra-config", '{"enable_multithread_load": false}'], False),
    (["--model-loader-extra-config", '{"enable_multithread_load": "true"}'], False),  # vLLM refuses a non-bool
    (["--model-loader-extra-config", "not json"], False),
    ([*MULTITHREAD, "--model-loader-extra-config", "{}"], False),  # argparse: the last value counts
    (["--model-loader-extra-config"], False),
])
def test_which_loader_an_argv_runs(argv: list[str], on: bool) -> None:
    assert multithread_load(argv) is on


def test_the_multi_thread_loader_uses_its_cited_rate_and_says_where_it_comes_from() -> None:
    config, profile, topo = _stack("prod")
    default = staged_outage(config, profile, topo)
    threaded = staged_outage(config, profile, topo, multithread=True)
    load = {p.name: p for p in threaded.phases}["load-page-cache"]
    assert load.seconds == math.ceil(rank_copy_gb(config, profile, topo) / MULTITHREAD_GB_PER_S)
    assert "vllm-omni#4896" in load.source and "the multi-thread loader" in load.figure
    assert {p.name: p for p in default.phases}["load-page-cache"].source == PAGE_CACHE_SOURCE
    assert threaded.total_s > default.total_s


def test_the_two_loader_rates_are_counted_alike() -> None:
    """Both rates are one copy of the cited run's checkpoint split over its ranks, per second of a rank: the
    multi-thread run's 158 GB over its 2 ranks, not over one (which gave 4.0 GB/s and a shorter outage than the
    default loader's, though no source shows it faster from a warm page cache)."""
    for run, rate in ((PAGE_CACHE_RUN, PAGE_CACHE_GB_PER_S), (MULTITHREAD_RUN, MULTITHREAD_GB_PER_S)):
        per_rank = run["checkpoint_gb"] / run["ranks"] / run["seconds"]
        assert rate <= per_rank < rate + 0.2, (run, rate)
    assert MULTITHREAD_GB_PER_S < PAGE_CACHE_GB_PER_S
    for figure in ("158 GB", "39.82 s", "158 GB / 2 / 39.82 s", f"{MULTITHREAD_GB_PER_S:g}"):
        assert figure in MULTITHREAD_SOURCE, figure


def test_the_multi_thread_loader_is_offered_only_where_it_models_shorter(monkeypatch: pytest.MonkeyPatch) -> None:
    values = read_stack_values("prod")
    assert "faster" not in build_plan("prod", parse_config("prod", values)).model["outage"]
    monkeypatch.setattr(outage_model, "MULTITHREAD_GB_PER_S", 2 * PAGE_CACHE_GB_PER_S)
    offered = build_plan("prod", parse_config("prod", values)).model["outage"]
    assert offered["faster"]["total_s"] < offered["staged"]["total_s"]
    assert "enable_multithread_load" in offered["faster"]["how"]


def test_a_stack_that_turns_the_multi_thread_loader_on_plans_with_it() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    values["serving"]["model_loader_extra_config"] = {"enable_multithread_load": True}
    config, profile, topo = _stack("prod")
    plan = build_plan("prod", parse_config("prod", values))
    outage = plan.model["outage"]
    assert "faster" not in outage  # nothing to suggest: it runs already
    assert outage["staged"]["total_s"] == staged_outage(config, profile, topo, multithread=True).total_s
    load = {p["name"]: p for p in outage["staged"]["phases"]}["load-page-cache"]
    assert "the multi-thread loader" in load["figure"] and load["source"] == MULTITHREAD_SOURCE


def test_the_multi_thread_loader_warms_every_expert_even_with_the_ep_filter() -> None:
    """vLLM 0.33.0 default_loader.py:329-336: the multi-thread iterator gets no `local_expert_ids`, so the node's
    page cache must hold every file; a rank still copies only its share (its `load_file` maps, it does not copy)."""
    config, profile, topo = _stack("prod", ep_weight_filter=True)
    total = config.model.weights_gb or profile.weights_gb
    assert node_warm_gb(config, profile, topo) < total
    assert node_warm_gb(config, profile, topo, multithread=True) == total


def test_the_default_loaders_rate_is_no_more_than_the_cited_runs_per_rank_figure() -> None:
    """The cited run's checkpoint over its ranks and its slowest rank's seconds bounds the figure from above (a rank
    copies only its share; vLLM skipped part of that checkpoint), and the source quotes that run."""
    run = PAGE_CACHE_RUN
    assert run["checkpoint_gb"] / run["ranks"] / run["seconds"] >= PAGE_CACHE_GB_PER_S
    for figure in (f"{run['checkpoint_gb']:g} GB", f"{run['seconds']:g} s", "InstantTensor", "tmpfs",
                   f"{PAGE_CACHE_GB_PER_S:g}"):
        assert figure in PAGE_CACHE_SOURCE, figure


def test_the_start_up_phase_is_the_cited_whole_start_up() -> None:
    """The start-up phase is vllm-project/vllm#43189's process start to service ready (DeepSeek-V4-Flash, 8 H20,
    TP=8 + EP, about 8 minutes), its weight load not taken off: no allowance."""
    assert STARTUP_S == 8 * 60
    for figure in ("vllm-project/vllm#43189", "8 H20", "approximately 8 minutes", "480 s", "vllm#50576",
                   "vllm#53320"):
        assert figure in STARTUP_SOURCE, figure
    assert "allowance" not in STARTUP_SOURCE
    config, profile, topo = _stack("prod")
    for outage in (cold_outage(config, profile, topo), staged_outage(config, profile, topo)):
        startup = {p.name: p for p in outage.phases}["start-up"]
        assert (startup.seconds, startup.source) == (STARTUP_S, STARTUP_SOURCE)


def test_prods_staged_restart_is_the_sum_of_its_sourced_phases() -> None:
    """Issue 33: every phase of prod's image change (vLLM's default loader, no EP filter) backed by a measurement or
    a cited figure, none a placeholder or an allowance."""
    config, profile, topo = _stack("prod")
    plan = build_plan("prod", config)
    outage = plan.model["outage"]
    assert outage["applies"] == "staged"
    staged = outage["staged"]
    load = {p["name"]: p for p in staged["phases"]}["load-page-cache"]
    assert load["seconds"] == math.ceil(rank_copy_gb(config, profile, topo) / PAGE_CACHE_GB_PER_S)
    assert "the default loader" in load["figure"]
    assert staged["total_s"] == STOP_S + load["seconds"] + STARTUP_S + CHECKS_S
    assert staged["total_s"] == staged_outage(config, profile, topo).total_s
    for phase in staged["phases"]:
        assert phase["source"] and "NOT YET MEASURED" not in phase["source"], phase
        for word in ("placeholder", "allowance"):
            assert word not in phase["source"], phase


def test_prods_staged_restart_is_within_ten_minutes() -> None:
    """Issue 33's goal: prod's image change, staged, at most 10 minutes by the model, each phase sourced (above).
    The cited whole start-up (480 s, its own weight load included) is most of it."""
    config, profile, topo = _stack("prod")
    staged = staged_outage(config, profile, topo)
    assert staged.total_s <= 600, staged
    assert {p.name: p.seconds for p in staged.phases}["start-up"] == STARTUP_S


def test_the_docs_give_the_figures_the_plan_computes() -> None:
    """The hand-written result in docs/speed.md and docs/what-a-change-costs.md follows the model: prod's staged
    total, its page-cache seconds and what a rank copies, h20's total."""
    config, profile, topo = _stack("prod")
    prod = staged_outage(config, profile, topo)
    phases = {p.name: p.seconds for p in prod.phases}
    h20 = staged_outage(*_stack("h20"))
    speed = (ROOT / "docs" / "speed.md").read_text()
    costs = (ROOT / "docs" / "what-a-change-costs.md").read_text()
    for page in (speed, costs):
        assert duration(prod.total_s) in page and f"page cache {phases['load-page-cache']} s" in page
        assert f"{rank_copy_gb(config, profile, topo):.1f} GB per rank" in page
    assert f"h20's\nat {duration(h20.total_s)}" in speed or f"h20's at {duration(h20.total_s)}" in speed


def test_a_measured_rank_on_hopper_copies_no_slower_than_the_modelled_rate() -> None:
    """tests/fixtures/gpu_page_cache_copy_h200.json (bench/gpu_page_cache_copy.py on a lent H200): one rank from
    memory to its GPU the default loader's way; docs/speed.md gives the same figures."""
    import json

    found = json.loads((ROOT / "tests" / "fixtures" / "gpu_page_cache_copy_h200.json").read_text())
    every = found["summary"]["every byte"]
    assert found["gpu"] == "NVIDIA H200" and every["copied_gb"] > 15
    assert every["gb_per_s"] >= PAGE_CACHE_GB_PER_S
    speed = (ROOT / "docs" / "speed.md").read_text()
    assert f"| one rank, every byte | {every['copied_gb']:.2f} | {every['median_s']:.2f} | {every['gb_per_s']:.2f} |" \
        in speed
    iterate = found["summary"]["iterate only"]
    assert f"{iterate['us_per_tensor']:.0f} µs per tensor" in speed
