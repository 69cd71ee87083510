"""The deploy lock: `pulumi up` and the group supervisor never act on a stack at the same time.

One exclusive `flock(2)` on `/run/lock/vllm-cluster-<stack>.lock` on the deploying host. The supervisor takes it
for each group restart (heal/supervisor.py) and `restart-group --yes` too; the Pulumi program takes it itself
when it runs for an update (`__main__.py`, never for a preview) and holds it until its process exits, which is
after its last resource is registered. Pulumi's own stack lock lives in the backend, where the supervisor cannot
see it; this one is local, so it only orders processes of the same host.
"""

from __future__ import annotations

import contextlib
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

    def _open(self) -> int:
        """A read-only descriptor of the lock file (flock(2) needs no write access), created mode 0666 when absent.

        Whoever comes first creates the file: `make up`'s `flock` (as root, mode 0644 under umask 022), the program,
        or a supervisor running as the deploying user. Opening an existing file read-only and without O_CREAT works
        for every user whatever its owner and mode, and is not refused by `fs.protected_regular` (O_CREAT on another
        user's file in the sticky /run/lock is). A file created here gets 0666 with fchmod, which the umask cannot
        narrow. PermissionError when this user may not even read it (the callers say how to fix that)."""
        try:
            return os.open(self.path, os.O_RDONLY | os.O_NOCTTY)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOCTTY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # created meanwhile by the other side
            return os.open(self.path, os.O_RDONLY | os.O_NOCTTY)
        with contextlib.suppress(OSError):  # a file system without modes: what open gave is what there is
            os.fchmod(fd, 0o666)
        return fd

    def try_acquire(self) -> bool:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def acquire(self) -> None:
        """Wait as long as it takes (as `flock FILE` does)."""
        fd = self._open()
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


HELD_ENV = "VLLM_CLUSTER_DEPLOY_LOCK_HELD"
"""Set by `make up` to the lock file its `flock` holds around `pulumi up`: the program, a grandchild, cannot take
the same flock(2) through a descriptor of its own (it would wait for its own caller for ever), so it takes none
when the named file is held. Set without holding it, nothing is skipped: the program takes the lock as usual."""

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
    taken = lock.try_acquire()
    if not taken and os.environ.get(HELD_ENV) == str(lock.path):
        say(f"deploy lock {lock.path} is held by the command that runs this update ({HELD_ENV}: `make up`'s "
            "flock): not taken again")
        return None
    if not taken:
        say(f"waiting for the deploy lock {lock.path}: the group supervisor (or restart-group --yes) is restarting "
            "the engine group; this update goes on when that ends")
        lock.acquire()
        say(f"deploy lock {lock.path} taken")
    _HELD.append(lock)
    return lock
