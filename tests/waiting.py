"""Waiting in tests: on a condition, with a generous deadline, never a fixed sleep (a loaded machine is slow; the
deadline only costs time when the test fails)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

START_DEADLINE_S = 120
"""How long a server started by a test may take to listen: nginx or sshd takes milliseconds, a loaded machine
seconds; the deadline only costs time when it never listens."""


def output_of(proc: subprocess.Popen[str]) -> str:
    """What a server that did not come up printed; killed first (its whole process group when it leads one: nginx's
    workers hold the pipe too), since a live one keeps its pipe open and a read would wait for ever."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    try:
        return proc.communicate(timeout=10)[0] or ""
    except subprocess.TimeoutExpired:  # a child of it still holds the pipe
        return "(its output could not be read: a child process holds the pipe)"


def wait_for(condition: Callable[[], Any], what: str | Callable[[], str], deadline_s: float) -> Any:
    """The condition's first truthy value, polled until the deadline; an AssertionError naming `what` after it (a
    callable `what` is called then, to show the state at the deadline)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {deadline_s}s: {what() if callable(what) else what}")
