"""The argument dry run: the command the program registers, run for real against images in a real Docker.

The images hold Debian's python3 and a vLLM stand-in whose `vllm serve` flags are the real vLLM 0.33.0
parser's, captured in tests/fixtures (bench/dry_run_real_vllm.py runs the same script on real vLLM 0.33.0).
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
from stacks.field_types import SECRET
from stacks.loader import parse_config
from stacks.plan import Plan, build_plan
from tests.conftest import ROOT
from tests.docker_harness import FLAGS, STANDIN, build_image, docker_ready, remove_image, renamed_flag, run_shell

GOOD = "vllm-cluster-test/vllm:0.33.0"
RENAMED = "vllm-cluster-test/vllm:0.34.0-renamed"
NO_VLLM = "vllm-cluster-test/python:bare"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    why = docker_ready()
    assert why is None, f"these tests need a Docker engine (.ci/run starts dockerd): {why}"
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
    assert " -e VLLM_TARGET_DEVICE=cpu vllm/vllm-openai:v0.33.0@sha256:" in first
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


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(STANDIN), "VLLM_STANDIN_FLAGS": str(FLAGS)}
    return subprocess.run([sys.executable, "-m", "checks.vllm_args", "--json", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_flag_that_parses_to_another_value_fails() -> None:
    out = _script("--expect", "tensor_parallel_size=8", "--", "/m", "--tensor-parallel-size", "4")
    verdict = json.loads(out.stdout)
    assert out.returncode == 1 and "tensor_parallel_size=4, expected '8'" in verdict["evidence"][0]


def test_a_bad_value_is_reported_with_the_flag(tmp_path: Path) -> None:
    out = _script("--", "/m", "--gpu-memory-utilization", "lots")
    verdict = json.loads(out.stdout)
    assert out.returncode == 1
    assert "argument --gpu-memory-utilization" in verdict["evidence"][-1] and "'lots'" in verdict["evidence"][-1]
