"""The staged change's page-cache warming (checks/page_cache.py): what it reads (vLLM 0.33.0's EP weight filter),
the memory bound, and, against a real Docker engine, that a failed warming leaves the running engine serving."""

from __future__ import annotations

import copy
import json
import socket
import struct
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks import page_cache
from components.check_commands import page_cache_command
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import build_plan
from tests.docker_harness import RUN, build_image, docker_ready, remove_image, run_shell
from tests.waiting import wait_for

TENSOR = 4096
"""Bytes of every tensor in the fixture shards."""


def write_shard(path: Path, names: list[str]) -> None:
    """A safetensors file by hand: the header, then TENSOR bytes per tensor, each filled with its index."""
    header = {n: {"dtype": "U8", "shape": [TENSOR], "data_offsets": [i * TENSOR, (i + 1) * TENSOR]}
              for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        for i in range(len(names)):
            handle.write(bytes([i % 256]) * TENSOR)


def model_dir(root: Path) -> Path:
    """Two shards: a dense one, and one with 8 experts' weights and scales."""
    root.mkdir(parents=True, exist_ok=True)
    dense = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    experts = [f"model.layers.0.mlp.experts.{e}.{part}" for e in range(8) for part in ("w1.weight", "w1.scale")]
    write_shard(root / "model-00001-of-00002.safetensors", dense)
    write_shard(root / "model-00002-of-00002.safetensors", experts)
    weight_map = {n: "model-00001-of-00002.safetensors" for n in dense}
    weight_map |= {n: "model-00002-of-00002.safetensors" for n in experts}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def header_bytes(path: Path) -> int:
    with open(path, "rb") as handle:
        return 8 + struct.unpack("<Q", handle.read(8))[0]


def test_without_the_filter_every_byte_is_warmed(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    verdict = page_cache.run("page-cache-n1", root, None, [])
    assert verdict.status == "pass"
    sizes = sum(p.stat().st_size for p in root.glob("*.safetensors"))
    assert verdict.details["needed_bytes"] == sizes and verdict.details["warmed_bytes"] == sizes
    assert verdict.details["not_warmed"] == []


def test_the_ep_filter_warms_this_nodes_experts_and_every_scale(tmp_path: Path) -> None:
    """EP 4, this node holding EP ranks 2-3: experts 4-7 of 8 (vLLM's linear placement), every `.scale` kept."""
    root = model_dir(tmp_path / "m")
    experts = page_cache.local_experts(*page_cache.experts_arg("8:4:2-3"))
    assert experts == {4, 5, 6, 7}
    verdict = page_cache.run("page-cache-n2", root, experts, [])
    first, second = sorted(root.glob("*.safetensors"))
    # the dense shard whole; of the expert shard its header, 4 own weights and all 8 scales
    expected = first.stat().st_size + header_bytes(second) + (4 + 8) * TENSOR
    assert verdict.status == "pass" and verdict.details["needed_bytes"] == expected
    assert verdict.details["warmed_bytes"] == expected


def test_the_bound_is_mem_available_less_the_engines_pinned_memory(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = model_dir(tmp_path / "m")
    first = sorted(root.glob("*.safetensors"))[0]
    budget = first.stat().st_size + 100
    monkeypatch.setattr(page_cache, "mem_available", lambda: budget + 5000)
    monkeypatch.setattr(page_cache, "pinned_bytes", lambda names: (5000, list(names)))
    verdict = page_cache.run("page-cache-n1", root, None, ["engine-x"])
    assert verdict.status == "pass"  # warming is a help: what does not fit is named, and loads from disk
    assert verdict.details["budget_bytes"] == budget and verdict.details["warmed_bytes"] == budget
    assert verdict.details["not_warmed"] == ["model-00002-of-00002.safetensors"]
    assert "not warmed: 1 of 2 shard(s), from model-00002-of-00002.safetensors" in verdict.summary
    assert any("pinned by the running engine 0.0 GB (engine-x)" in e for e in verdict.evidence)


def test_a_short_or_missing_shard_fails(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    second = sorted(root.glob("*.safetensors"))[1]
    with open(second, "r+b") as handle:
        handle.truncate(second.stat().st_size - 1)
    verdict = page_cache.run("page-cache-n1", root, None, [])
    assert verdict.status == "fail" and "model-00002-of-00002.safetensors" in verdict.summary
    second.unlink()
    assert page_cache.run("page-cache-n1", root, None, []).status == "fail"


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A running 'old engine' container answering HTTP on a loopback port."""
    problem = docker_ready()
    if problem:
        pytest.fail(f"these tests need a Docker engine (`make services` starts dockerd): {problem}")
    tag, name = f"vllm-cluster-pagecache:{RUN}", f"vc-pagecache-{RUN}"
    build_image(tag, tmp_path, with_vllm=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        subprocess.run(["docker", "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", tag, "python3", "-m",
                        "http.server", "8000"], check=True, capture_output=True)
        wait_for(lambda: _answers(port), f"{name} answering on {port}", 120)
        yield name, port
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        remove_image(tag)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _running(name: str) -> bool:
    done = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True)
    return done.stdout.strip() == "true"


def test_a_failed_warming_leaves_the_running_engine_serving(tmp_path: Path, serving: tuple[str, int]) -> None:
    """The shipped command, as the program registers it for prod's node2 (its ranks' experts, its engine container
    by name), run by bash as the node's shell would, with the old engine running: a missing shard FAILS (the update
    stops before any container moves) and the engine still runs and answers; with the shard back it PASSES and
    names the running engine whose pinned memory it subtracted."""
    name, port = serving
    root = model_dir(tmp_path / "models" / "m")
    values = copy.deepcopy(read_stack_values("prod"))
    values["model"] |= {"host_dir": str(tmp_path / "models"), "path": "m"}
    values["container"]["name"] = name
    config = parse_config("prod", values)
    plan = build_plan("prod", config)
    check = next(c for c in plan.checks if c.name == "page-cache-node2")
    command = page_cache_command(config, plan, check)
    assert f"--engine {name}" in command and f"--model-dir {root}" in command
    shard = sorted(root.glob("*.safetensors"))[1]
    kept = shard.read_bytes()
    shard.unlink()
    failed = run_shell(command)
    assert failed.returncode == 1 and failed.stdout.startswith("FAIL page-cache-node2:"), failed.stdout
    assert _running(name) and _answers(port)
    shard.write_bytes(kept)
    passed = run_shell(command)
    assert passed.returncode == 0 and passed.stdout.startswith("PASS page-cache-node2: warmed "), passed.stdout
    assert "pinned by the running engine" in passed.stdout and f"({name})" in passed.stdout
    assert _running(name) and _answers(port)
