"""The deploy lock: the program takes it for an update (never for a preview) and waits while a restart holds it."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import threading
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
from tests.waiting import wait_for

HOLD = ("import sys; from pathlib import Path; from components.deploy_lock import hold_for_update; "
        "hold_for_update('s', lambda line: print(line, flush=True), Path(sys.argv[1])); print('taken', flush=True); "
        "sys.stdin.read()")


def wait_for_line(lines: list[str], text: str) -> None:
    """Until a line the holder printed contains `text` (its reader thread appends to `lines`)."""
    wait_for(lambda: any(text in line for line in list(lines)), lambda: f"no {text!r} in {lines}", 120)


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
        wait_for_line(lines, "waiting for the deploy lock")
        assert "taken" not in lines and update.poll() is None
        restart.release()
        wait_for_line(lines, "taken")
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


def shared_dir() -> Iterator[Path]:
    """A sticky world-writable folder like /run/lock that another user can reach (pytest's tmp_path is 0700)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="deploy-lock-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def sticky() -> Iterator[Path]:
    yield from shared_dir()


def take_as(uid: int, path: Path) -> int:
    """Exit status of a forked child that, as `uid`, takes and releases the lock: 0 taken, 1 busy, 2 refused."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, only the lock
        code = 3
        try:
            os.setgid(65534)
            os.setuid(uid)
            lock = DeployLock(path)
            code = 0 if lock.try_acquire() else 1
            lock.release()
        except PermissionError:
            code = 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a child as nobody")
def test_a_lock_made_by_make_ups_flock_as_root_is_taken_by_another_user(sticky: Path) -> None:
    import pwd

    path = lock_path("s", sticky)
    old = os.umask(0o022)
    try:  # util-linux flock(1): open(O_RDONLY|O_CREAT, 0666) under the umask: 0644, root's
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT, 0o666))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert take_as(pwd.getpwnam("nobody").pw_uid, path) == 0, "a supervisor running as another user takes it"


def test_a_lock_file_it_creates_is_0666_whatever_the_umask(sticky: Path) -> None:
    old = os.umask(0o077)
    try:
        lock = DeployLock(lock_path("s", sticky))
        assert lock.try_acquire()
        lock.release()
    finally:
        os.umask(old)
    assert lock_path("s", sticky).stat().st_mode & 0o777 == 0o666


def test_make_ups_flock_around_pulumi_up_is_not_waited_for_by_the_program(sticky: Path) -> None:
    """`make up` runs `flock FILE pulumi up`: the program, its grandchild, must not wait for its own caller."""
    import shutil

    if shutil.which("flock") is None:
        pytest.fail("util-linux flock is not installed")
    hold = HOLD.replace("sys.stdin.read()", "pass")
    path = lock_path("s", sticky)
    out = subprocess.run(["flock", str(path), sys.executable, "-c", hold, str(sticky)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, deploy_lock.HELD_ENV: str(path)})
    said = out.stdout + out.stderr
    assert out.returncode == 0 and "taken" in out.stdout, said
    assert "held by the command that runs this update" in out.stdout, said
    restart = DeployLock(path)
    assert restart.try_acquire(), "released when the update ended"
    restart.release()
