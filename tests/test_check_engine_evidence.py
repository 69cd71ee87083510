"""NCCL transport from real NCCL output, DP engines from vLLM-style logs, Ray from a real Ray cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.bundle import heredoc_command
from checks.engines import classify as engines
from checks.nccl_transport import classify
from tests.conftest import ROOT

NCCL = ROOT / "tests" / "fixtures" / "nccl"


def test_ib_with_gdrdma_passes() -> None:
    for name in ("ib_gdrdma_nccl707.log", "ib_gdrdma_aks36.log"):
        v = classify((NCCL / name).read_text(), transport="ib")
        assert v.status == "pass" and "GPU Direct RDMA" in v.summary, v.line()


def test_real_socket_fallback_fails() -> None:
    v = classify((NCCL / "socket_fallback_h200.log").read_text(), transport="roce")
    assert v.status == "fail" and v.exit_code == 1
    assert any("NET/IB : No device found" in e for e in v.evidence)
    assert "ibv_devinfo" in (v.next_step or "")


def test_roce_without_gdr_fails_and_names_hcas() -> None:
    v = classify((NCCL / "roce_gdr_disabled_nccl1537.log").read_text(), transport="roce")
    assert v.status == "fail" and "without GPU Direct RDMA" in v.summary
    assert "GPU Direct RDMA Disabled for mlx5_0, mlx5_1" in v.evidence
    assert classify((NCCL / "roce_gdr_disabled_nccl1537.log").read_text(), require_gdr=False).status == "pass"


def test_declared_roce_but_ib_used() -> None:
    v = classify((NCCL / "ib_no_gdr_nv_peer_memory56.log").read_text(), transport="roce")
    assert v.status == "fail" and "the stack declares RoCE" in v.summary


def test_no_nccl_info_is_inconclusive() -> None:
    v = classify("INFO 12-01 vllm starting\nLoading weights\n")
    assert v.status == "inconclusive" and v.exit_code == 2 and "NCCL_DEBUG=INFO" in (v.next_step or "")


def test_cli_reads_stdin_and_bundle() -> None:
    log = (NCCL / "socket_fallback_h200.log").read_text()
    out = subprocess.run([sys.executable, "-m", "checks.nccl_transport", "--json"], cwd=ROOT, input=log,
                         capture_output=True, text=True)
    assert out.returncode == 1 and json.loads(out.stdout)["status"] == "fail"
    command = heredoc_command("nccl_transport", ["--log-file", str(NCCL / "ib_gdrdma_aks36.log"), "--transport", "ib"])
    shipped = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, cwd="/")
    assert shipped.returncode == 0 and shipped.stdout.startswith("PASS nccl-transport")


LOG = """(APIServer pid=1) INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.33.0
(EngineCore_DP0 pid=322) INFO 12-01 10:31:02 [kv_cache_utils.py:864] GPU KV cache size: 1,234,560 tokens
(EngineCore_DP1 pid=323) INFO 12-01 10:31:05 [kv_cache_utils.py:864] GPU KV cache size: 1,234,560 tokens
"""


def test_engines_joined_missing_and_dead() -> None:
    assert engines(LOG, [0, 1]).status == "pass"
    missing = engines(LOG, [0, 1, 2])
    assert missing.status == "fail" and "[2] never reported" in missing.summary
    dead = engines(LOG + "(EngineCore_DP1 pid=323) Engine core proc EngineCore_DP1 died unexpectedly\n", [0, 1])
    assert dead.status == "fail" and "[1] died" in dead.summary


RAY = shutil.which("ray", path=str(Path(sys.executable).parent))


def _ray(*args: str) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([str(RAY), *args], check=True, capture_output=True, env=env, timeout=180)


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    assert RAY, "ray must be installed (requirements-dev.txt)"
    _ray("stop", "--force")
    _ray("start", "--head", "--port=6391", "--num-gpus=8", "--num-cpus=1", "--include-dashboard=false",
         "--node-ip-address=127.0.0.1", "--disable-usage-stats")
    try:
        yield "127.0.0.1:6391"
    finally:
        _ray("stop", "--force")


def _check(address: str, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "checks.ray_cluster", "--address", address, "--json", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_real_ray_cluster_missing_worker_then_complete(ray_head: str) -> None:
    code, v = _check(ray_head, "--nodes", "2", "--gpus", "16", "--wait-s", "2", "--interval-s", "1")
    assert code == 1 and "1/2 nodes, 8/16 GPUs" in v["summary"]
    assert "worker container" in v["next_step"]
    _ray("start", f"--address={ray_head}", "--num-gpus=8", "--num-cpus=1", "--node-ip-address=127.0.0.1",
         "--disable-usage-stats")
    code, v = _check(ray_head, "--nodes", "2", "--gpus", "16", "--wait-s", "30", "--interval-s", "1")
    assert code == 0 and v["summary"] == "Ray sees 2 nodes and 16 GPUs"
