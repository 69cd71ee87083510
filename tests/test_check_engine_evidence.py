"""NCCL transport from real NCCL output, DP engines from vLLM-style logs, Ray from a real Ray cluster."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RayHost:
    """A network namespace of its own (loopback only) holding a Ray head: its ports cannot collide with another
    test run's, and stopping it kills only the processes in this namespace (`ray stop` would stop every Ray on the
    machine)."""

    ns: str
    temp_dir: Path
    address: str = "127.0.0.1:6379"

    def run(self, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        return subprocess.run(["ip", "netns", "exec", self.ns, *argv], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=timeout)

    def ray(self, *args: str) -> None:
        done = self.run(str(RAY), *args, f"--temp-dir={self.temp_dir}", "--num-cpus=1", "--num-gpus=8",
                        "--node-ip-address=127.0.0.1", "--disable-usage-stats")
        assert done.returncode == 0, done.stdout + done.stderr

    def stop(self) -> None:
        """SIGKILL whatever runs in the namespace (what `ray stop --force` does, to these processes only) until
        nothing does; then the namespace."""
        deadline = time.monotonic() + 60
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True, timeout=30).stdout
        return [int(p) for p in out.split()]


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHost]:
    assert RAY, "ray must be installed (requirements-dev.txt)"
    ns = f"rayev-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=30)
    # Ray's AF_UNIX socket paths must stay under 108 bytes: a short directory in /tmp
    host = RayHost(ns, Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp")))
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, capture_output=True, timeout=30)
        host.ray("start", "--head", "--port=6379", "--include-dashboard=false")
        yield host
    finally:
        host.stop()


def _check(head: RayHost, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    out = head.run(sys.executable, "-m", "checks.ray_cluster", "--address", head.address, "--json", *args,
                   timeout=120)
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_real_ray_cluster_missing_worker_then_complete(ray_head: RayHost) -> None:
    code, v = _check(ray_head, "--nodes", "2", "--gpus", "16", "--wait-s", "2", "--interval-s", "1")
    assert code == 1 and "1/2 nodes, 8/16 GPUs" in v["summary"]
    assert "worker container" in v["next_step"]
    ray_head.ray("start", f"--address={ray_head.address}")
    code, v = _check(ray_head, "--nodes", "2", "--gpus", "16", "--wait-s", "120", "--interval-s", "1")
    assert code == 0 and v["summary"] == "Ray sees 2 nodes and 16 GPUs"
