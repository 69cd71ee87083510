"""The outage model (stacks/planner/outage.py): one set of phases feeds the plan, `stacks diff` and the
engine-ready timeout floor; the bytes each rank reads follow vLLM 0.33.0's loader."""

from __future__ import annotations

import copy

import pytest

from review.downtime import downtime_of, phase_lines
from review.plan_diff import diff_plans, to_markdown
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.model_cards import get_profile
from stacks.planner.outage import (
    cold_outage,
    node_warm_gb,
    rank_read_gb,
    staged_outage,
)
from stacks.planner.plan import build_plan
from stacks.planner.topology import derive_topology


def _stack(name: str, **parallelism: object) -> tuple:
    values = copy.deepcopy(read_stack_values(name))
    values.setdefault("parallelism", {}).update(parallelism)
    config = parse_config(name, values)
    topo, _ = derive_topology(config)
    return config, get_profile(config.model.profile), topo


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


def test_without_the_ep_filter_every_rank_reads_the_whole_checkpoint() -> None:
    config, profile, topo = _stack("prod")
    total = config.model.weights_gb or profile.weights_gb
    assert rank_read_gb(config, profile) == total
    assert node_warm_gb(config, profile, topo) == total


def test_the_ep_filter_reads_a_ranks_own_experts_only() -> None:
    config, profile, topo = _stack("prod", ep_weight_filter=True)
    total = config.model.weights_gb or profile.weights_gb
    experts = total * profile.weight_split.experts_gb / profile.weight_split.total_gb
    ep = config.parallelism.data * config.parallelism.tensor
    assert rank_read_gb(config, profile) == pytest.approx(total - experts + experts / ep)
    ranks = max(n.gpus_used for n in topo.nodes)
    assert node_warm_gb(config, profile, topo) == pytest.approx(total - experts + experts * ranks / ep)
    assert staged_outage(config, profile, topo).total_s < staged_outage(*_stack("prod")).total_s


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
    applied = head["model"]["outage"][head["model"]["outage"]["applies"]]
    assert found["outage"]["head"] == applied
    text = downtime_of(found)
    minutes, seconds = divmod(applied["total_s"], 60)
    assert f"down about {minutes} min {seconds} s" in text
    lines = phase_lines(found)
    assert len(lines) == len(applied["phases"])
    markdown = to_markdown(found)
    for phase, line in zip(applied["phases"], lines, strict=True):
        assert line in markdown and phase["source"] in line and phase["figure"] in line
