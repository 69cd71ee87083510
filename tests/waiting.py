"""Waiting in tests: on a condition, with a generous deadline, never a fixed sleep (a loaded machine is slow; the
deadline only costs time when the test fails)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], Any], what: str, deadline_s: float) -> Any:
    """The condition's first truthy value, polled until the deadline; an AssertionError naming `what` after it."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {deadline_s}s: {what}")
