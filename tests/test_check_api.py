"""API checks against a real stand-in server process: each check passes and fails when it should."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def standin(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "standin.py"), "--port", str(port), *args],
                            env={**os.environ, **(env or {})})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def run_api(url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "checks.api", "--url", url, "--served-name", "DeepSeek-V4.1-Flash",
                          "--json", "--interval-s", "1", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, **(env or {})})
    lines = out.stdout.strip().splitlines()
    return out.returncode, json.loads(lines[-1]), out.stdout


def test_all_sections_pass_after_slow_start_and_503() -> None:
    with standin("--start-delay-s", "2", "--unhealthy-s", "2") as url:
        start = time.monotonic()
        code, verdict, stdout = run_api(url, "--deadline-s", "30")
        elapsed = time.monotonic() - start
    assert code == 0, stdout
    assert verdict["status"] == "pass"
    assert set(verdict["details"]) == {"health", "models", "chat", "thinking", "stream"}
    assert elapsed >= 3.5  # waited through the closed port and the 503s
    progress = [line for line in stdout.splitlines() if line.startswith("[api]")]
    assert progress and "elapsed, phase:" in progress[0]
    assert any("loading (port closed)" in line or "starting" in line for line in progress)


def test_health_deadline_fails_with_phase() -> None:
    with standin("--unhealthy-s", "600") as url:
        code, verdict, _ = run_api(url, "--deadline-s", "3", "--sections", "health,models")
    assert code == 1 and verdict["status"] == "fail"
    assert any("phase starting" in e for e in verdict["evidence"])
    assert "models" not in verdict["details"]  # stops after health fails


def test_wrong_answer_fails_at_once_with_answer() -> None:
    with standin("--answer", "324") as url:
        start = time.monotonic()
        code, verdict, _ = run_api(url, "--sections", "chat")
        elapsed = time.monotonic() - start
    assert code == 1
    assert "got '324'" in " ".join(verdict["evidence"])
    assert elapsed < 10


def test_missing_reasoning_fails() -> None:
    with standin("--no-reasoning") as url:
        code, verdict, _ = run_api(url, "--sections", "thinking")
    assert code == 1 and "no reasoning content" in verdict["evidence"][0]


def test_stream_without_done_fails() -> None:
    with standin("--no-done") as url:
        code, verdict, _ = run_api(url, "--sections", "stream")
    assert code == 1 and "[DONE] missing" in verdict["evidence"][0]


def test_wrong_served_name_fails() -> None:
    with standin("--served-name", "other") as url:
        code, verdict, _ = run_api(url, "--sections", "models")
    assert code == 1 and "['other']" in verdict["evidence"][0]


def test_bearer_key_from_env_and_auth_enforced() -> None:
    env = {"STANDIN_KEY": "sk-test-123"}
    with standin("--api-key-env", "STANDIN_KEY", env=env) as url:
        code, verdict, stdout = run_api(url, "--sections", "models,chat",
                                        env={"VLLM_API_KEY": "sk-test-123"})
        assert code == 0, stdout
        assert verdict["details"]["auth"]["ok"] is True
        assert "sk-test-123" not in stdout
        code, verdict, _ = run_api(url, "--sections", "models", env={"VLLM_API_KEY": "wrong"})
        assert code == 1 and "401" in verdict["evidence"][0]


def test_auth_not_enforced_fails() -> None:
    with standin() as url:
        code, verdict, _ = run_api(url, "--sections", "models", env={"VLLM_API_KEY": "sk-x"})
    assert code == 1 and "not 401" in " ".join(verdict["evidence"])


def test_unreachable_is_a_connection_failure() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, verdict, _ = run_api(url, "--sections", "models")
    assert code == 1 and "ConnectError" in verdict["evidence"][0]
