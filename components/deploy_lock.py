"""The deploy lock: `pulumi up` and the group supervisor never act on a stack at the same time.

One exclusive `flock(2)` on `/run/lock/vllm-cluster-<stack>.lock` on the deploying host. The supervisor takes it
for each group restart (review/supervisor.py) and `restart-group --yes` too; the Pulumi program takes it itself
when it runs for an update (`__main__.py`, never for a preview) and holds it until its process exits, which is
after its last resource is registered. Pulumi's own stack lock lives in the backend, where the supervisor cannot
see it; this one is local, so it only orders processes of the same host.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

LOCK_DIR = Path("/run/lock")
"""World-writable and sticky on systemd hosts; cleared at boot, like the processes that held a lock."""


def lock_path(stack: str, directory: Path | None = None) -> Path:
    """The deploy lock both the program (or `flock … pulumi up`) and the supervisor take."""
    return (directory or LOCK_DIR) / f"vllm-cluster-{stack}.lock"


class DeployLock:
    """An exclusive `flock(2)` on a file: the same lock `flock FILE pulumi up -s STACK` takes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def acquire(self) -> None:
        """Wait as long as it takes (as `flock FILE` does)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


_HELD: list[DeployLock] = []
"""The program's lock, kept open until the process exits (the kernel releases it then)."""


def hold_for_update(stack: str, say: Callable[[str], None], directory: Path | None = None) -> DeployLock | None:
    """Take the stack's deploy lock for the rest of this process, waiting while a group restart holds it; None (and
    a line saying so) where the host has no lock directory."""
    directory = directory or LOCK_DIR
    if not directory.is_dir():
        say(f"no {directory} on this host: the group supervisor's deploy lock is not taken; a supervisor on "
            "another host is not waited for")
        return None
    lock = DeployLock(lock_path(stack, directory))
    if not lock.try_acquire():
        say(f"waiting for the deploy lock {lock.path}: the group supervisor (or restart-group --yes) is restarting "
            "the engine group; this update goes on when that ends")
        lock.acquire()
        say(f"deploy lock {lock.path} taken")
    _HELD.append(lock)
    return lock
