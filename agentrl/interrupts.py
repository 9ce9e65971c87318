"""Ctrl-C and SIGTERM for `python -m agentrl`: raised on the main thread as exceptions, never inside a store write.

Python raises KeyboardInterrupt wherever the main thread happens to be. Inside SQLAlchemy that can leave an SQLite
transaction open on a pooled connection: every later write to the MLflow store, from any thread, then waits out the
busy timeout and fails with "database is locked", and the stopped run cannot close itself as KILLED (CI met it).
`held()` wraps such writes: a signal that arrives inside is raised as soon as the write ends. A second signal
during a held write is not deferred (a user pressing Ctrl-C twice means it; a second SIGTERM kills at once).
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `docker stop`, a scheduler's preemption), raised where Ctrl-C raises KeyboardInterrupt:
    a terminated run closes as KILLED with its `resume it` line, as a Ctrl-C'd one does."""


_depth = 0  # held() sections open on the main thread
_pending: int | None = None  # the signal that arrived inside one


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _pending
    if signum == signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once, mid-cleanup
    if _depth and _pending is None:
        _pending = signum
        return
    _raise(signum)


def install() -> None:
    """Route SIGINT and SIGTERM through `held()`; only the main thread can (elsewhere: nothing is changed).

    SIGINT keeps an ignored disposition (a background job's): only Python's default Ctrl-C handler is replaced.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


@contextmanager
def held() -> Iterator[None]:
    """Defer Ctrl-C and SIGTERM to the end of the block (main thread; other threads never get them)."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending is not None:
            signum, _pending = _pending, None
            _raise(signum)


class HeldCalls:
    """`target` with every method call run inside `held()`: for a store client, whose calls are writes."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            with held():
                return value(*args, **kwargs)

        return call
