"""The heal tools (`drift`, `restart-group`, `supervise`, the unit renderers) print exception text: a node's ssh or
docker stderr, an unreadable file's error. Whatever credential that text echoes (a Docker host or proxy URL with a
password, a token in a variable) goes through the one masking rule (stacks/model/masking.py) before it is printed,
logged or posted."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from heal.drift import DriftRow, table
from heal.node_access import NODE_MAP_ENV
from heal.supervisor import Log
from tests.conftest import ROOT

PASSWORD = "Tok3nS3cretPw"
LEAK = f"http://deploy:{PASSWORD}@10.0.0.9:2375"


def _fake_docker(tmp_path: Path) -> dict[str, str]:
    """A `docker` on PATH that fails as the real one does when DOCKER_HOST holds a URL with a password."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\necho \'error during connect: Get "{LEAK}/v1.43/containers/json": dial tcp '
                      f'10.0.0.9:2375: connect: connection refused; ORG_TOKEN={PASSWORD}\' >&2\nexit 1\n')
    docker.chmod(0o755)
    nodes = {n: {"docker_host": LEAK} for n in ("h20-1", "h20-2")}
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", NODE_MAP_ENV: json.dumps(nodes)}


def test_drift_that_cannot_run_never_prints_the_credential_a_node_echoed(tmp_path: Path) -> None:
    env = _fake_docker(tmp_path)
    for flags in ([], ["--json"]):
        out = subprocess.run([sys.executable, "-m", "stacks", "drift", "h20", *flags], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 2, out.stderr
        assert PASSWORD not in out.stdout + out.stderr, out.stdout + out.stderr
        assert "error during connect" in out.stderr and "***" in out.stderr, out.stderr
        if flags:
            assert "***@10.0.0.9" in json.loads(out.stdout)["error"]


def test_a_drift_row_holding_a_credential_is_masked_in_the_table_and_the_json() -> None:
    row = DriftRow("h20-1", "engine", "command", "vllm serve /models/x", f"vllm serve --api-key={PASSWORD}")
    assert PASSWORD not in table([row]) and "--api-key=***" in table([row])
    assert PASSWORD not in json.dumps(row.as_dict()) and row.as_dict()["found"] == "vllm serve --api-key=***"


def test_the_supervisor_log_masks_exception_text() -> None:
    out = io.StringIO()
    log = Log(out, "h20")
    log("restart", f"failed: node h20-2: docker container inspect failed (exit 1): Get \"{LEAK}/v1.43\"",
        f"HF_TOKEN={PASSWORD}")
    assert PASSWORD not in out.getvalue() and PASSWORD not in log.lines[0], out.getvalue()
    assert "***@10.0.0.9" in log.lines[0] and "HF_TOKEN=***" in log.lines[0]
