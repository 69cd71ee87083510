"""Expert-parallel keys: `parallelism.all2all_backend`, `eplb`, `dbo`, `expert_placement`, `ep_weight_filter`.

Expected argv are typed from vLLM 0.33.0's option names (vllm/engine/arg_utils.py:1313-1358), not produced by the
code under test. What vLLM itself does with each argv was captured from the real 0.33.0 on CPU
(tests/fixtures/vllm-0.33.0-expert-parallel.json, bench/expert_parallel_real_vllm.py): every refusal below quotes
the message vLLM printed, and the capture is checked to be of the argv the planner renders today.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.expert_parallel_real_vllm import QWEN, V3, planned_argv, planned_values, refused_argv, variant
from components.check_commands import preflight_command
from review.plan_diff import diff_plans, to_markdown
from stacks.model.config import ALL2ALL_BACKENDS, REFUSED_ALL2ALL_BACKENDS
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.image_cards import card_of_version
from stacks.planner.option_values import option_value_problem
from stacks.planner.plan import build_plan
from stacks.planner.serve_options import card_table, read_serve_argv
from tests.conftest import ROOT, flag_pairs, plan_of, problems_of

CAPTURE = json.loads((ROOT / "tests" / "fixtures" / "vllm-0.33.0-expert-parallel.json").read_text())
EP_FLAGS = {"--all2all-backend", "--enable-eplb", "--eplb-config", "--enable-dbo", "--dbo-decode-token-threshold",
            "--dbo-prefill-token-threshold", "--expert-placement-strategy", "--enable-ep-weight-filter"}


def example() -> dict[str, Any]:
    return read_stack_values("wide-ep", ROOT / "examples")


def test_the_capture_is_of_vllm_0_33_0_and_of_todays_argv() -> None:
    """The committed capture ran the argv the planner renders now (else: recapture, the bench says how)."""
    assert CAPTURE["vllm_version"] == "0.33.0"
    planned = planned_argv()
    assert {n: (c["model"], c["argv"]) for n, c in CAPTURE["planned"].items()} == {
        n: (m, a) for n, (m, a) in planned.items()}
    assert {n: (c["model"], c["argv"]) for n, c in CAPTURE["refused"].items()} == {
        n: (m, a) for n, (m, a) in refused_argv().items()}


@pytest.mark.parametrize("name", list(planned_values()))
def test_vllm_accepts_each_planned_argv_as_the_stack_asked(name: str) -> None:
    """Each planned case went through vLLM's parser and create_engine_config, and vLLM kept every value."""
    values, node, _ = planned_values()[name]
    case = CAPTURE["planned"][name]
    assert "ok" in case, case
    got, par = case["ok"], values["parallelism"]
    eplb, dbo = par.get("eplb", {}), par.get("dbo", {})
    assert got["enable_expert_parallel"] is True and got["data_parallel_size"] == 16
    assert got["data_parallel_rank"] == (8 if node == "gpu2" else 0)
    assert got["all2all_backend"] == par.get("all2all_backend", "allgather_reducescatter")
    assert got["enable_eplb"] is eplb.get("enabled", False)
    for field in ("num_redundant_experts", "window_size", "step_interval", "log_balancedness", "use_async",
                  "communicator", "enable_migration_batching", "log_balancedness_interval"):
        if field in eplb:
            assert got["eplb_config"][field] == eplb[field], field
    assert got["enable_dbo"] is dbo.get("enabled", False)
    if dbo:
        assert (got["dbo_decode_token_threshold"], got["dbo_prefill_token_threshold"]) == (
            dbo["decode_token_threshold"], dbo["prefill_token_threshold"])
    assert got["expert_placement_strategy"] == par.get("expert_placement", "linear")
    assert got["enable_ep_weight_filter"] is par.get("ep_weight_filter", False)


def test_every_backend_vllm_runs_as_named_is_a_choice_and_was_tried() -> None:
    """The key's choices are 0.33.0's `--all2all-backend` choices less the four it does not run as named."""
    choices = card_table(card_of_version("0.33.0")).options["--all2all-backend"].choices
    assert sorted(ALL2ALL_BACKENDS) == sorted(set(choices or ()) - set(REFUSED_ALL2ALL_BACKENDS))
    assert set(REFUSED_ALL2ALL_BACKENDS) - set(choices or ()) == {"passthrough"}  # not even on the CLI
    tried = {c["ok"]["all2all_backend"] for c in CAPTURE["planned"].values()}
    other_hardware = {c["ok"]["all2all_backend"] for n, c in CAPTURE["refused"].items() if n.endswith(" GPUs")}
    assert tried | other_hardware == set(ALL2ALL_BACKENDS) and other_hardware == {"mori_high_throughput",
                                                                                 "mori_low_latency"}


@pytest.mark.parametrize("version", ["0.33.0", "0.32.0"])
@pytest.mark.parametrize("name", list(planned_values()))
def test_each_rendered_argv_parses_with_the_image_cards_option_table(name: str, version: str) -> None:
    """The whole rendered argv (parsers included) read as that release's `vllm serve` parser reads it, each value
    checked against the card (choices, the EPLBConfig fields and bounds of `--eplb-config`)."""
    values, node, _ = planned_values()[name]
    argv = plan_of(values).node(node).containers[0].vllm_args or []
    table = card_table(card_of_version(version))
    items = read_serve_argv(argv, table)
    assert [i.problem for i in items if i.problem] == []
    assert [option_value_problem(i, table) for i in items if option_value_problem(i, table)] == []
    assert {i.option for i in items if i.option in EP_FLAGS} == {w for w in argv if w in EP_FLAGS}


def test_the_example_renders_the_keys_on_every_node_right_after_expert_parallel() -> None:
    plan = plan_of(example())
    for node in plan.nodes:
        pairs = flag_pairs((node.containers[0].vllm_args or [])[1:])
        at = pairs.index(("--enable-expert-parallel", None))
        assert pairs[at + 1:at + 4] == [("--all2all-backend", "deepep_low_latency"), ("--enable-eplb", None),
                                        ("--eplb-config", '{"num_redundant_experts":16}')]
    assert plan.topology["label"] == "mp-dp16-tp1-pp1-ep16"
    assert [n.role for n in plan.nodes] == ["dp-head", "headless-engine"]


def test_every_key_renders_as_vllm_spells_it() -> None:
    values = variant(profile=V3, all2all_backend="deepep_high_throughput", ep_weight_filter=False, eplb={
        "enabled": True, "num_redundant_experts": 32, "window_size": 500, "step_interval": 2000,
        "log_balancedness": True, "log_balancedness_interval": 10, "use_async": False, "communicator": "pynccl",
        "enable_migration_batching": True}, dbo={"enabled": True, "decode_token_threshold": 64,
                                                 "prefill_token_threshold": 1024})
    pairs = flag_pairs((plan_of(values).head.containers[0].vllm_args or [])[1:])
    assert [p for p in pairs if p[0] in EP_FLAGS] == [
        ("--all2all-backend", "deepep_high_throughput"), ("--enable-eplb", None),
        ("--eplb-config", '{"num_redundant_experts":32,"window_size":500,"step_interval":2000,'
                          '"log_balancedness":true,"log_balancedness_interval":10,"use_async":false,'
                          '"communicator":"pynccl","enable_migration_batching":true}'),
        ("--enable-dbo", None), ("--dbo-decode-token-threshold", "64"), ("--dbo-prefill-token-threshold", "1024")]
    filtered = variant(eplb={"enabled": False}, ep_weight_filter=True, expert_placement="round_robin", profile=V3)
    pairs = flag_pairs((plan_of(filtered).head.containers[0].vllm_args or [])[1:])
    assert [p for p in pairs if p[0] in EP_FLAGS] == [
        ("--all2all-backend", "deepep_low_latency"), ("--expert-placement-strategy", "round_robin"),
        ("--enable-ep-weight-filter", None)]


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_defaults_render_nothing_new(stack: str) -> None:
    """The committed stacks leave every new key at vLLM's default: not one new flag (golden plans unchanged)."""
    for node in plan_of(read_stack_values(stack)).nodes:
        assert not EP_FLAGS & set(node.containers[0].vllm_args or [])


def _one_node(values: dict[str, Any]) -> dict[str, Any]:
    values["nodes"] = values["nodes"][:1]
    values["nodes"][0].pop("data_parallel_local")
    values["parallelism"] |= {"data": 1, "tensor": 1}
    return values


# (id, stack values, expected key, a sentence of vLLM's own message, the captured case that printed it or None)
RULES: list[tuple[str, dict[str, Any], str, str, str | None]] = [
    ("eplb-without-ep", variant(expert=False, all2all_backend="allgather_reducescatter"), "parallelism.eplb.enabled",
     "enable_expert_parallel must be True to use EPLB.", "eplb without expert parallelism"),
    ("eplb-at-ep1", _one_node(variant(eplb={"enabled": True})), "parallelism.eplb.enabled",
     "EPLB requires tensor, prefill-context, or data parallelism, but got TP=1, PCP=1, DP=1.", "eplb at TP1 DP1"),
    ("redundant-without-eplb", variant(eplb={"enabled": False, "num_redundant_experts": 16}),
     "parallelism.eplb.num_redundant_experts", "num_redundant_experts is set to 16 but EPLB is not enabled. Either "
     "enable EPLB or unset num_redundant_experts.", "redundant experts without eplb"),
    ("redundant-not-dividing", variant(eplb={"enabled": True, "num_redundant_experts": 15}),
     "parallelism.eplb.num_redundant_experts", "EPLB currently only supports even distribution of experts across "
     "ranks. Got 271 experts and 16 EP ranks.", None),  # at model init (fused_moe/layer.py:271-279), not on CPU
    ("async-with-torch-nccl", variant(eplb={"enabled": True, "communicator": "torch_nccl"}),
     "parallelism.eplb.communicator", "torch_nccl communicator is incompatible with async EPLB due to NCCL "
     "multi-stream conflicts.", "async eplb with torch_nccl"),
    ("dbo-with-allgather", variant(profile=V3, all2all_backend="allgather_reducescatter", eplb={"enabled": False},
                                   dbo={"enabled": True}), "parallelism.all2all_backend",
     "Microbatching currently only supports the deepep_low_latency, deepep_high_throughput, nixl_ep all2all backends "
     "on this platform. allgather_reducescatter is not supported.", "dbo with allgather_reducescatter"),
    ("dbo-threshold-1", variant(profile=V3, all2all_backend="deepep_high_throughput",
                                dbo={"enabled": True, "decode_token_threshold": 1}),
     "parallelism.dbo.decode_token_threshold", "dbo_decode_token_threshold and dbo_prefill_token_threshold must be "
     "at least the number of microbatches (2).", "dbo decode threshold 1"),
    ("dbo-with-engram", variant(all2all_backend="deepep_high_throughput", dbo={"enabled": True}),
     "parallelism.dbo.enabled", "DeepSeek V4.1 Engram does not support DBO or microbatching.", None),
    ("moonep-fp8", variant(profile=V3, all2all_backend="moonep", eplb={"enabled": False}),
     "parallelism.all2all_backend", "The moonep all2all backend currently supports unquantized BF16 models only; "
     "got quantization='fp8'.", "moonep with an FP8 model"),
    ("moonep-eplb", variant(profile=QWEN, all2all_backend="moonep"), "parallelism.eplb.enabled",
     "The moonep all2all backend does not support EPLB yet", "moonep with eplb"),
    ("moonep-round-robin", variant(profile=QWEN, all2all_backend="moonep", eplb={"enabled": False},
                                   expert_placement="round_robin"), "parallelism.expert_placement",
     "The moonep all2all backend requires linear expert placement", "moonep with round_robin"),
]


@pytest.mark.parametrize(("values", "key", "said", "captured"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_each_rule_is_refused_with_its_key_and_vllms_reason(values: dict[str, Any], key: str, said: str,
                                                            captured: str | None) -> None:
    found = [p for p in problems_of(copy.deepcopy(values)) if p.key == key]
    assert found, key
    assert any(said in (p.upstream or "") and p.fix for p in found), [p.render() for p in found]
    if captured is not None:  # the quoted sentence is what the real vLLM 0.33.0 printed for that argv
        case = CAPTURE["refused"][captured]
        assert "error" in case and said in case["message"], case


# (id, stack values, key, what the refusal says): vLLM accepts these and does something else, silently or with a
# log line; the planner refuses each
SILENT: list[tuple[str, dict[str, Any], str, str]] = [
    ("a2a-without-ep", variant(expert=False, eplb={"enabled": False}), "parallelism.all2all_backend",
     "use_all2all_kernels = use_ep and dp_size > 1"),
    ("dbo-at-dp1", {**read_stack_values("h20"), "parallelism": {**read_stack_values("h20")["parallelism"],
                                                                "expert": True, "dbo": {"enabled": True},
                                                                "all2all_backend": "deepep_low_latency"}},
     "parallelism.dbo.enabled", "returns early with one DP rank"),
    ("round-robin-with-eplb", variant(expert_placement="round_robin"), "parallelism.expert_placement",
     "Round-robin expert placement is only supported for models with multiple expert groups and no redundant "
     "experts. Falling back to linear expert placement."),
    ("round-robin-with-deepep-ht", variant(eplb={"enabled": False}, all2all_backend="deepep_high_throughput",
                                           expert_placement="round_robin"), "parallelism.expert_placement",
     "Round-robin expert placement currently only supports the DeepEP low-latency or NIXL EP backend, but "
     "'deepep_high_throughput' was configured."),
    ("weight-filter-with-eplb", variant(ep_weight_filter=True), "parallelism.ep_weight_filter",
     "every rank loads every expert"),
    ("weight-filter-without-ep", variant(expert=False, all2all_backend="allgather_reducescatter",
                                         eplb={"enabled": False}, ep_weight_filter=True),
     "parallelism.ep_weight_filter", "expert parallelism is off"),
]


@pytest.mark.parametrize(("values", "key", "said"), [r[1:] for r in SILENT], ids=[r[0] for r in SILENT])
def test_what_vllm_would_ignore_or_replace_is_refused(values: dict[str, Any], key: str, said: str) -> None:
    found = [p for p in problems_of(copy.deepcopy(values)) if p.key == key]
    assert any(said in p.message and p.fix for p in found), [p.render() for p in problems_of(values)]


@pytest.mark.parametrize("backend", sorted(REFUSED_ALL2ALL_BACKENDS))
def test_backends_vllm_does_not_run_as_named_are_refused_with_why(backend: str) -> None:
    problem = next(p for p in problems_of(variant(all2all_backend=backend)) if p.key == "parallelism.all2all_backend")
    why, fix = REFUSED_ALL2ALL_BACKENDS[backend]
    assert problem.value == backend and problem.message == why and problem.fix == fix
    case = CAPTURE["refused"].get(f"all2all_backend {backend}")
    if backend in ("pplx", "naive"):  # vLLM 0.33.0 took it, said so in a log line and ran the default
        assert case is not None and case["ok"]["all2all_backend"] == "allgather_reducescatter"
        assert case["warnings"] == [f"The '{backend}' all2all backend has been removed. Falling back to "
                                    "'allgather_reducescatter'."]
        assert case["warnings"][0] in why
    elif backend == "passthrough":
        assert case is not None and "invalid choice: 'passthrough'" in case["message"]


def test_a_removed_backend_exits_2_naming_the_key_before_anything_is_planned(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.mycluster.yaml").write_text((ROOT / "examples" / "Pulumi.wide-ep.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "stacks", "plan", "mycluster", "--set",
                           "parallelism.all2all_backend=pplx"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "VLLM_CLUSTER_ROOT": str(tmp_path)})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "parallelism.all2all_backend" in out and "Falling back to 'allgather_reducescatter'" in out
    assert "Traceback" not in out


def test_each_redundant_expert_adds_one_experts_bytes_per_gpu_in_plan_json() -> None:
    """DeepSeek-V4.1-Flash's card: 275.5 GB of routed experts over 256 experts = 1.076 GB per expert; 16 redundant
    experts over 16 GPUs put one more expert on each GPU."""
    plain = plan_of(variant(eplb={"enabled": True})).to_json_dict()["memory"][0]
    wide = plan_of(example()).to_json_dict()["memory"][0]
    assert "redundant_experts" not in plain["weights_split_gb"]
    assert wide["weights_split_gb"]["redundant_experts"] == round(275.5 / 256, 2)
    assert wide["weights_gb"] == pytest.approx(plain["weights_gb"] + 275.5 / 256, abs=0.01)
    assert wide["free_for_kv_gb"] == pytest.approx(plain["free_for_kv_gb"] - 275.5 / 256, abs=0.01)


def test_too_many_redundant_experts_do_not_fit_and_the_refusal_says_so() -> None:
    """1008 redundant: (256 + 1008) / 16 = 79 experts per GPU, 63 of them redundant (~68 GB): over 80 GB x 0.9."""
    problems = problems_of(variant(eplb={"enabled": True, "num_redundant_experts": 1008}))
    memory = next(p for p in problems if p.key == "nodes.0.gpus.memory_gb")
    assert "redundant experts 67.8" in memory.message and "out of memory" in (memory.upstream or "")


@pytest.mark.parametrize("redundant", [1008, 400, 256])
def test_the_memory_refusal_names_the_redundant_experts_and_the_most_that_fit(redundant: int) -> None:
    """Redundant experts that overflow the GPU: the refusal names their key and offers the largest count that
    both fits and divides over EP16 (240: 256 + 240 = 496 = 16 x 31), and that count plans."""
    problems = problems_of(variant(eplb={"enabled": True, "num_redundant_experts": redundant}))
    memory = next(p for p in problems if p.key in ("nodes.0.gpus.memory_gb", "serving.max_model_len"))
    assert "parallelism.eplb.num_redundant_experts: 240 or fewer" in (memory.fix or ""), memory.render()
    assert plan_of(variant(eplb={"enabled": True, "num_redundant_experts": 240})).nodes
    problems_of(variant(eplb={"enabled": True, "num_redundant_experts": 256}))  # the next that divides does not fit


def test_stacks_diff_shows_an_expert_parallel_change_restarts_the_group_and_its_memory() -> None:
    """More redundant experts and another backend: a new argv on every node (vLLM is fail-stop: the whole group
    is replaced) and a heavier GPU."""
    base = plan_of(example()).to_json_dict()
    head = plan_of(variant(all2all_backend="deepep_high_throughput",
                           eplb={"enabled": True, "num_redundant_experts": 32})).to_json_dict()
    diff = diff_plans("mycluster", "main", base, head)
    engines = ["engine-gpu1-dsv41-wide-ep", "engine-gpu2-dsv41-wide-ep"]
    for name in engines:
        assert diff["containers"][name]["argv"] == {
            "--all2all-backend": ["deepep_low_latency", "deepep_high_throughput"],
            "--eplb-config": ['{"num_redundant_experts":16}', '{"num_redundant_experts":32}']}
    assert diff["replaced"] == engines
    assert diff["memory"]["weights_gb"][1] == pytest.approx(diff["memory"]["weights_gb"][0] + 275.5 / 256, abs=0.1)
    md = to_markdown(diff)
    assert "--eplb-config" in md and "deepep_high_throughput" in md


def test_the_node_preflight_sizes_the_redundant_experts_too() -> None:
    """The preflight recomputes per-GPU memory from the real headers with the plan's redundant experts and the
    card's routed experts (tests/test_memory_model.py runs it); without redundant experts it is not told any."""
    for values, told in ((example(), True), (variant(eplb={"enabled": True}), False)):
        config = parse_config("mycluster", values)
        plan = build_plan("mycluster", config)
        sized = [preflight_command(config, plan, c).split("\n", 1)[0] for c in plan.checks
                 if c.module == "checks.preflight" and "model" in c.sections]
        assert len(sized) == 2  # one per node
        for command in sized:
            assert ("--redundant-experts 16 --routed-experts 256" in command) is told, command
            assert ("--redundant-experts" in command) is told


def test_a_weight_filter_with_eplb_offers_turning_either_off() -> None:
    """With EPLB on the filter does nothing; either key resolves it, so the fix names both."""
    problem = next(p for p in problems_of(variant(ep_weight_filter=True)) if p.key == "parallelism.ep_weight_filter")
    assert problem.fix == "ep_weight_filter: false, or eplb.enabled: false", problem.render()


@pytest.mark.parametrize("name", ["decode_token_threshold", "prefill_token_threshold"])
def test_a_negative_dbo_threshold_with_dbo_on_asks_for_2_or_more(name: str) -> None:
    """0 and 1 pass the schema but are refused while DBO is on: the range offered starts at 2 then."""
    on = [p for p in problems_of(variant(all2all_backend="deepep_high_throughput", dbo={"enabled": True, name: -3}))
          if p.key == f"parallelism.dbo.{name}"]
    assert on and on[0].fix is not None and on[0].fix.startswith("a value from 2 to 16777216"), on
    off = [p for p in problems_of(variant(dbo={"enabled": False, name: -3})) if p.key == f"parallelism.dbo.{name}"]
    assert off and off[0].fix == "a value from 0 to 16777216", off


def _gpus(values: dict[str, Any], model: str, memory_gb: float) -> dict[str, Any]:
    for node in values["nodes"]:
        node["gpus"] |= {"model": model, "memory_gb": memory_gb}
    return values


@pytest.mark.parametrize("backend", ["mori_low_latency", "mori_high_throughput"])
def test_amds_mori_backends_are_refused_on_nvidia_gpus(backend: str) -> None:
    """vLLM's parser takes them (the capture); its MoRI manager asserts AMD kernels and gfx942/gfx950."""
    problem = next(p for p in problems_of(variant(all2all_backend=backend)) if p.key == "parallelism.all2all_backend")
    assert "'NVIDIA H100 80GB HBM3'" in problem.message and "gfx942 and gfx950" in (problem.upstream or "")
    assert problem.value == backend and "deepep" in (problem.fix or "")
    assert "ok" in CAPTURE["refused"][f"all2all_backend {backend} on NVIDIA GPUs"]  # vLLM would not stop it


@pytest.mark.parametrize("backend", ["flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"])
def test_multi_node_nvlink_backends_across_roce_nodes_are_refused_and_warned_where_undecidable(backend: str) -> None:
    """Two H100 nodes talk over the fabric, not NVLink: refused naming the GPU. One node, or an NVL72 rack's
    GB200s: the fabric handles cannot be seen offline, so a warning."""
    problem = next(p for p in problems_of(variant(all2all_backend=backend)) if p.key == "parallelism.all2all_backend")
    assert "spans 2 nodes of 'NVIDIA H100 80GB HBM3'" in problem.message and "MNNVL" in problem.message
    rack = plan_of(_gpus(variant(all2all_backend=backend), "NVIDIA GB200", 186))
    assert any(w.startswith(f"parallelism.all2all_backend {backend}:") and "'NVIDIA GB200'" in w
               for w in rack.warnings), rack.warnings


@pytest.mark.parametrize("use_async", [True, False])
def test_xpus_xccl_communicator_is_refused_on_nvidia_gpus(use_async: bool) -> None:
    """On CUDA vLLM runs torch_xccl as NCCL P2P over the device group, past the async-NCCL check."""
    problem = next(p for p in problems_of(variant(eplb={"enabled": True, "communicator": "torch_xccl",
                                                        "use_async": use_async}))
                   if p.key == "parallelism.eplb.communicator")
    assert "'NVIDIA H100 80GB HBM3'" in problem.message and "eplb_communicator.py" in problem.message
    assert ("async EPLB" in problem.message) is use_async and "torch_gloo" in (problem.fix or "")


def _moe(values: dict[str, Any], *words: str) -> dict[str, Any]:
    values["serving"]["extra_args"] = list(words)
    return values


@pytest.mark.parametrize("words", [["--moe-backend=flashinfer_moe_ep_cutedsl"],
                                   ["--moe-backend", "flashinfer_moe_ep_mega_deep_gemm"]])
def test_a_self_dispatching_moe_backend_with_an_all2all_backend_is_refused(words: list[str]) -> None:
    """vLLM's KernelConfig refuses the pair (kernel.py:207-215); with the default it silently runs passthrough."""
    problem = next(p for p in problems_of(_moe(variant(), *words)) if p.key == "serving.extra_args.0")
    assert "cannot be paired with all2all_backend='deepep_low_latency'" in (problem.upstream or "")
    assert "allgather_reducescatter" in (problem.fix or "")
    plan = plan_of(_moe(variant(all2all_backend="allgather_reducescatter"), *words))
    assert any("vLLM runs all2all_backend passthrough" in w for w in plan.warnings), plan.warnings


def test_the_deep_gemm_moe_ep_backend_on_another_architecture_is_refused() -> None:
    values = _moe(variant(profile=QWEN, all2all_backend="allgather_reducescatter", eplb={"enabled": False}),
                  "--moe-backend", "flashinfer_moe_ep_mega_deep_gemm")
    problem = next(p for p in problems_of(values) if p.key == "serving.extra_args.0")
    assert "is only supported for DeepSeek-V4 models" in (problem.upstream or "") and "kernel.py:231-243" in (
        problem.upstream or "")


def test_on_a_dense_model_expert_parallelism_is_refused() -> None:
    """It was a warning; vLLM 0.33.0 raises at engine start-up (vllm/config/model.py:1498-1503). The rest of the
    case is tests/test_cross_option_rules.py."""
    problems = problems_of(variant(profile="qwen3-8b"))
    assert [p.key for p in problems] == ["parallelism.expert"], [p.render() for p in problems]
    assert not any("dense model: vLLM does nothing" in w for w in plan_of(example()).warnings)
