"""Polling for a condition in tests (a server's side effect that lands a moment after the reply)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.02) -> bool:
    """Poll `predicate` until it is truthy or `timeout` seconds pass; returns its last verdict. The default
    timeout is generous on purpose: it only bounds a hang, a loaded machine must not trip it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
