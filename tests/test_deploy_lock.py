"""The deploy lock: the program takes it for an update (never for a preview) and waits while a restart holds it."""

from __future__ import annotations

import runpy
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pulumi
import pytest

import components.deploy_lock as deploy_lock
import components.program
from components.deploy_lock import DeployLock, hold_for_update, lock_path
from review.registrations import own_event_loop
from tests.conftest import ROOT
from tests.pulumi_harness import Mocks

HOLD = ("import sys; from pathlib import Path; from components.deploy_lock import hold_for_update; "
        "hold_for_update('s', lambda line: print(line, flush=True), Path(sys.argv[1])); print('taken', flush=True); "
        "sys.stdin.read()")


def wait_for(lines: list[str], text: str, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while not any(text in line for line in list(lines)):
        if time.monotonic() > end:
            raise AssertionError(f"no {text!r} within {deadline_s}s: {lines}")
        time.sleep(0.1)


def test_an_update_waits_while_a_restart_holds_the_lock_and_holds_it_until_it_exits(tmp_path: Path) -> None:
    restart = DeployLock(lock_path("s", tmp_path))
    assert restart.try_acquire()
    update = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    assert update.stdout is not None
    out = update.stdout
    threading.Thread(target=lambda: lines.extend(line.strip() for line in out), daemon=True).start()
    try:
        wait_for(lines, "waiting for the deploy lock")
        assert "taken" not in lines and update.poll() is None
        restart.release()
        wait_for(lines, "taken")
        assert not DeployLock(lock_path("s", tmp_path)).try_acquire(), "the update holds it while it runs"
    finally:
        restart.release()
        assert update.stdin is not None
        update.stdin.close()
        update.wait(timeout=60)
    assert DeployLock(lock_path("s", tmp_path)).try_acquire(), "released when the update's process ended"


def test_no_lock_directory_is_said_not_fatal(tmp_path: Path) -> None:
    said: list[str] = []
    assert hold_for_update("s", said.append, tmp_path / "absent") is None
    assert len(said) == 1 and "is not taken" in said[0]


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(deploy_lock, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(components.program, "deploy", lambda stack: {})  # the entry point's lock, not the program
    yield tmp_path
    for held in deploy_lock._HELD:
        held.release()
    deploy_lock._HELD.clear()


@pytest.mark.filterwarnings("ignore:coroutine 'RPCManager.do_rpc.<locals>.rpc_wrapper' was never awaited")
@pytest.mark.parametrize("preview", [True, False])  # the entry point runs outside an engine: its RPCs never run
def test_the_entry_point_takes_the_lock_for_an_update_only(lock_dir: Path, preview: bool) -> None:
    with own_event_loop():  # nothing of this run is left on the worker's loop for the next program test
        pulumi.runtime.set_mocks(Mocks(stdout={}), project="vllm-cluster", stack="lockcheck", preview=preview)
        runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
    other = DeployLock(lock_path("lockcheck", lock_dir))
    try:
        assert other.try_acquire() is preview, "an update holds the lock, a preview does not"
    finally:
        other.release()
