"""The argument dry run: the command the program registers, run for real against images in a real Docker.

The images hold Debian's python3 and a vLLM stand-in whose `vllm serve` flags (with defaults) and parser
registries are the real vLLM 0.33.0's, captured in tests/fixtures, and which reproduces serve's own launch
checks line by line (tests/vllm_standin, each with the upstream lines it mirrors). bench/dry_run_real_vllm.py
runs the same script and argv on the real vLLM 0.33.0 and on the stand-in and compares them (README).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.check_commands import dry_run_command
from stacks.model.errors import ConfigError
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config
from stacks.planner.plan import Plan, build_plan
from tests.conftest import ROOT
from tests.docker_harness import RUN, build_image, docker_ready, remove_image, renamed_flag, run_shell, standin_env

GOOD = f"vllm-cluster-test/vllm:0.33.0-{RUN}"
RENAMED = f"vllm-cluster-test/vllm:0.34.0-renamed-{RUN}"
NO_VLLM = f"vllm-cluster-test/python:bare-{RUN}"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    why = docker_ready()
    assert why is None, f"these tests need a Docker engine (`make services` starts dockerd): {why}"
    work = tmp_path_factory.mktemp("images")
    tags = {
        "good": build_image(GOOD, work),
        # vLLM renames a flag: the new image rejects what the old one accepted.
        "renamed": build_image(RENAMED, work, renamed_flag("--enable-expert-parallel", "--expert-parallel",
                                                           "0.34.0")),
        "bare": build_image(NO_VLLM, work, with_vllm=False),
    }
    yield tags
    for tag in tags.values():
        remove_image(tag)


def plan_with_image(values: dict[str, Any], image: str, stack: str) -> tuple[Any, Plan]:
    values = copy.deepcopy(values)
    values["image"] = image
    config = parse_config(stack, values)
    return config, build_plan(stack, config)


def dry_runs(config: Any, plan: Plan) -> dict[str, str]:
    return {c.node or "": dry_run_command(config, plan, c) for c in plan.checks if c.module == "checks.vllm_args"}


def verdict_of(out: subprocess.CompletedProcess[str]) -> str:
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]


def test_command_shape_no_gpu_no_network_no_secret(prod_values: dict[str, Any]) -> None:
    prod_values["api_key"] = SECRET
    config, plan = plan_with_image(prod_values, "vllm/vllm-openai:v0.33.0@sha256:" + "ab" * 32, "prod")
    commands = dry_runs(config, plan)
    assert set(commands) == {"node1", "node2"}
    head = commands["node1"]
    first = head.splitlines()[0]
    assert first.startswith("timeout 600 docker run --rm -i --network none --pull never --entrypoint python3 ")
    mount = ("$(test -f /mnt/disk2/modelscope/models/deepseek-ai/DeepSeek-V4.1-Flash/config.json && echo --mount "
             "type=bind,src=/mnt/disk2/modelscope/models/deepseek-ai/DeepSeek-V4.1-Flash,"
             "dst=/models/deepseek-ai/DeepSeek-V4.1-Flash,readonly)")
    assert f" -e VLLM_TARGET_DEVICE=cpu {mount} vllm/vllm-openai:v0.33.0@sha256:" in first
    assert " --engine-config " in first  # vLLM's create_engine_config on the mounted config.json
    assert "--gpus" not in first and "VLLM_API_KEY" not in first and "-v " not in first
    assert " - --name args-dry-run-node1 " in first and "--expect tensor_parallel_size=8" in first
    assert "--expect data_parallel_size=2" in first and " -- /models/deepseek-ai/DeepSeek-V4.1-Flash " in first
    node2 = commands["node2"].splitlines()[0]
    assert "--headless" in node2 and "--expect data_parallel_start_rank=1" in node2 and "--expect port" not in node2


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_every_node_passes_in_an_image_whose_vllm_has_these_flags(stack: str, images: dict[str, str],
                                                                 request: pytest.FixtureRequest) -> None:
    config, plan = plan_with_image(request.getfixturevalue(f"{stack}_values"), images["good"], stack)
    for node, command in dry_runs(config, plan).items():
        out = run_shell(command)
        assert out.returncode == 0, (node, verdict_of(out))
        line = verdict_of(out)
        assert line.startswith(f"PASS args-dry-run-{node}: ")
        role = plan.node(node).role
        assert ("imports vllm 0.33.0, ray 2.60.0" in line) == (role == "ray-worker"), line
        launcher = {"dp-head": "run_multi_api_server (API server processes (1))",  # prod sets the rust frontend
                    "headless-engine": "run_headless", "ray-head": "run_server"}.get(role)
        assert launcher is None or f"serve reached {launcher}" in line, line


def test_every_rank_server_of_an_external_node_passes_in_one_run(images: dict[str, str]) -> None:
    """External load balancing: the node's one dry run parses each of its rank servers' argv (`--more-argv`), in
    the image, through docker's and the shell's quoting of the JSON."""
    from bench.dp_lb_real_vllm import dp16

    config, plan = plan_with_image(dp16("external"), images["good"], "h20")
    for node, command in dry_runs(config, plan).items():
        out = run_shell(command)
        line = verdict_of(out)
        assert out.returncode == 0, (node, line)
        names = [c.name for c in plan.node(node).containers]
        assert line.startswith(f"PASS args-dry-run-{node}: ") and f"of {names[0]}, and every other server's: " \
            f"{len(names)} servers accepted" in line, line
        assert "serve reached run_server (one API server in this process)" in line


SERVE_REJECTS = [
    # (extra argv or config override, node serve rejects, its error): the three argv of issue 12 item 8.
    # vLLM 0.33.0 gives these messages (bench/dry_run_real_vllm.py, README). The plan itself refuses the first
    # two in serving.extra_args (managed options); the dry run must refuse them too if they ever reach argv.
    (["--api-server-count", "2"], "node2",
     "ValueError: --api-server-count=2 cannot be used with --headless (no API servers are started in headless "
     "mode)."),
    (["--data-parallel-rank", "1"], "node2",
     "ValueError: Cannot use more than one data parallel load balancing mode."),
    ({"serving": {"tool_call_parser": "deepseek_v5"}}, "node1",
     "KeyError: invalid tool call parser: deepseek_v5 (chose from { apertus,"),
]


def _with_argv(plan: Plan, words: list[str]) -> Plan:
    """The plan with `words` appended to every vLLM argv, as if it had generated them."""
    nodes = [n.model_copy(update={"containers": [c.model_copy(update={"vllm_args": [*c.vllm_args, *words]})
                                                 if c.vllm_args is not None else c for c in n.containers]})
             for n in plan.nodes]
    return plan.model_copy(update={"nodes": nodes})


@pytest.mark.parametrize(("override", "rejected", "error"), SERVE_REJECTS,
                         ids=["headless+api-server-count", "headless+data-parallel-rank", "unknown-tool-parser"])
def test_what_vllm_serve_rejects_before_loading_fails_the_dry_run(
        override: Any, rejected: str, error: str, prod_values: dict[str, Any], images: dict[str, str]) -> None:
    values = copy.deepcopy(prod_values)
    if isinstance(override, list):
        values["serving"] = {**values["serving"], "extra_args": override}
        with pytest.raises(ConfigError, match="which the config manages"):
            plan_with_image(values, images["good"], "prod")  # the plan refuses it first
        values = copy.deepcopy(prod_values)
    else:
        for section, fields in override.items():
            values[section] = {**values[section], **fields}
    config, plan = plan_with_image(values, images["good"], "prod")  # the plan accepts this
    if isinstance(override, list):
        plan = _with_argv(plan, override)
    for node, command in dry_runs(config, plan).items():
        out = run_shell(command)
        line = verdict_of(out)
        if node == rejected:
            assert out.returncode == 1, line
            assert line.startswith(f"FAIL args-dry-run-{node}: the vLLM in {images['good']} rejects this node's argv")
            assert error in line, line
        else:  # the other node's vLLM accepts the same setting, as vLLM 0.33.0 does
            assert out.returncode == 0, line


def test_a_renamed_flag_fails_the_dry_run_with_vllms_own_error(prod_values: dict[str, Any],
                                                               images: dict[str, str]) -> None:
    config, plan = plan_with_image(prod_values, images["renamed"], "prod")
    for node, command in dry_runs(config, plan).items():
        out = run_shell(command)
        line = verdict_of(out)
        assert out.returncode == 1, line
        assert line.startswith(f"FAIL args-dry-run-{node}: the vLLM in {images['renamed']} rejects this node's argv")
        assert "unrecognized arguments: --enable-expert-parallel" in line
        assert "the running engines were not touched" in line and "stacks rollback" in line


def test_an_image_without_vllm_cannot_run_the_dry_run(prod_values: dict[str, Any], images: dict[str, str]) -> None:
    config, plan = plan_with_image(prod_values, images["bare"], "prod")
    out = run_shell(dry_runs(config, plan)["node1"])
    assert out.returncode == 2 and "CANNOT-RUN args-dry-run-node1: vLLM is not importable" in verdict_of(out)


def test_an_image_that_is_not_on_the_node_is_not_pulled(prod_values: dict[str, Any], images: dict[str, str]) -> None:
    config, plan = plan_with_image(prod_values, "vllm-cluster-test/vllm:never-pulled", "prod")
    out = run_shell(dry_runs(config, plan)["node1"])
    assert out.returncode != 0 and "No such image" in out.stderr  # --pull never: the pull step comes first


def _script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **standin_env(), **(env or {})}
    full["PYTHONPATH"] = f"{full['PYTHONPATH']}:{ROOT}"
    return subprocess.run([sys.executable, "-m", "checks.vllm_args", "--json", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


def test_a_flag_that_parses_to_another_value_fails() -> None:
    out = _script("--expect", "tensor_parallel_size=8", "--", "/m", "--tensor-parallel-size", "4")
    verdict = json.loads(out.stdout)
    assert out.returncode == 1 and "tensor_parallel_size=4, expected '8'" in verdict["evidence"][0]


def test_serve_picks_its_launcher_and_api_server_count_as_vllm_does() -> None:
    """DP2 head: two API servers by default, one with the rust frontend (serve.py lines 113-136); a headless
    node with a start rank is hybrid LB and starts none; DP1: one API server in this process."""
    head = ["--", "/m", "--data-parallel-size", "2", "--data-parallel-size-local", "1"]
    default = json.loads(_script(*head).stdout)
    assert default["details"] == {"launcher": "run_multi_api_server", "api_server_count": 2}
    rust = json.loads(_script(*head, env={"VLLM_USE_RUST_FRONTEND": "1"}).stdout)
    assert rust["details"] == {"launcher": "run_multi_api_server", "api_server_count": 1}
    headless = json.loads(_script(*head, "--headless", "--data-parallel-start-rank", "1").stdout)
    assert headless["details"] == {"launcher": "run_headless", "api_server_count": 0}
    single = json.loads(_script("--", "/m").stdout)
    assert single["details"] == {"launcher": "run_server", "api_server_count": None}
    negated = json.loads(_script(*head, "--no-data-parallel-hybrid-lb", "--data-parallel-rank", "0").stdout)
    assert negated["details"] == {"launcher": "run_server", "api_server_count": None}  # external LB: one server


def test_the_engine_looks_up_the_reasoning_parser_on_every_node() -> None:
    """vLLM's engine core resolves --reasoning-parser before serving (v1/structured_output/__init__.py), on
    headless nodes too; the dry run makes that lookup where it stops."""
    for extra in ([], ["--headless"]):
        out = _script("--", "/m", "--reasoning-parser", "deepseek_v5", *extra)
        verdict = json.loads(out.stdout)
        assert out.returncode == 1 and verdict["evidence"][-1].startswith(
            "KeyError: Reasoning parser 'deepseek_v5' not found. Available parsers: beam,")
    assert _script("--", "/m", "--reasoning-parser", "deepseek_v41", "--headless").returncode == 0


def test_a_bad_value_is_reported_with_the_flag(tmp_path: Path) -> None:
    out = _script("--", "/m", "--gpu-memory-utilization", "lots")
    verdict = json.loads(out.stdout)
    assert out.returncode == 1
    assert "argument --gpu-memory-utilization" in verdict["evidence"][-1] and "'lots'" in verdict["evidence"][-1]


def test_the_engine_config_is_built_from_the_nodes_config_json(prod_values: dict[str, Any], images: dict[str, str],
                                                               tmp_path: Path) -> None:
    """The model directory is mounted read-only and vLLM's create_engine_config runs on it: the scheduler's
    rule answers here (vllm/config/scheduler.py:317-328), with vLLM's message. The plan refuses the same argv in
    serving.extra_args offline; appended to the planned argv, the dry run must refuse it too."""
    values = copy.deepcopy(prod_values)
    values["model"] = {**values["model"], "host_dir": str(tmp_path)}
    config, plan = plan_with_image(values, images["good"], "prod")
    model = Path(config.model.host_path)
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 1048576}))
    for node, command in dry_runs(config, plan).items():
        out = run_shell(command)
        assert out.returncode == 0, (node, verdict_of(out))
        assert "engine config max_model_len=1048576, max_num_batched_tokens=8192, max_num_seqs=128" in \
            verdict_of(out)
    values["serving"] = {**values["serving"], "extra_args": ["--no-enable-chunked-prefill"]}
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(8192\) is smaller than max_model_len"):
        plan_with_image(values, images["good"], "prod")
    for node, command in dry_runs(config, _with_argv(plan, ["--no-enable-chunked-prefill"])).items():
        out = run_shell(command)
        line = verdict_of(out)
        assert out.returncode == 1, line
        assert line.startswith(f"FAIL args-dry-run-{node}: vLLM's create_engine_config in {images['good']} refuses")
        assert "SchedulerConfig: max_num_batched_tokens (8192) is smaller than max_model_len (1048576)." in line
    model.joinpath("config.json").unlink()  # a node without it: parsed and launched, and the verdict says so
    out = run_shell(dry_runs(config, plan)["node1"])
    assert out.returncode == 0 and "engine config not built: no config.json in" in verdict_of(out)
