"""Ctrl-C and SIGTERM for `python -m agentrl`: raised on the main thread as exceptions, but never at an unsafe point.

Python raises KeyboardInterrupt wherever the main thread happens to be, and in a threaded process that can be
inside another library's critical section:
- inside SQLAlchemy, it can leave an SQLite transaction open on a pooled connection: every later write to the
  MLflow store then waits out the busy timeout and fails ("database is locked"), and the stopped run cannot close
  itself as KILLED (CI met it);
- just after `logging` took its module lock, it leaks the lock: every other thread that logs then blocks for
  good, and the run hangs in its cleanup, joining them (seen here).

So a signal is deferred in two kinds of section, and raised as usual everywhere else:
- `held()` wraps writes to the store: the signal is raised as soon as the write ends;
- `between_steps()` wraps a training loop: the signal is raised at the loop's next `stop_point()` (the end of the
  step), after a line on stderr saying so.
A second signal while one is deferred is raised at once (a user pressing Ctrl-C twice means it; a second SIGTERM
kills the process at once).
A signal raised at once can still be lost: Python prints and ignores an exception raised inside a weakref callback
or a `__del__` (a garbage collection that runs SQLAlchemy's registry cleanup, say), and the run goes on. So a
raised signal is remembered, and a training loop that still reaches a `stop_point()` raises it again; an eval,
which has no stop points, raises it at its next chunk of tasks (`swallowed_point()`) once Python reported it
ignored.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `docker stop`, a scheduler's preemption), raised where Ctrl-C raises KeyboardInterrupt:
    a terminated run closes as KILLED with its `resume it` line, as a Ctrl-C'd one does."""


# sections open on the main thread: held() ("write") and between_steps() ("loop")
_open = {"write": 0, "loop": 0}
_pending: int | None = None  # the signal that arrived inside one
_raised: int | None = None  # the last signal raised at once: if a stop point is reached after it, it was swallowed
_swallowed: int | None = None  # that signal, once Python reported it ignored (sys.unraisablehook)

_NAMES = {signal.SIGINT: ("Ctrl-C", "press Ctrl-C again"), signal.SIGTERM: ("SIGTERM", "a second SIGTERM")}


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _pending, _raised
    if signum == signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once, mid-cleanup
    if any(_open.values()) and _pending is None:
        _pending = signum
        if _open["loop"]:
            name, again = _NAMES.get(signum, (f"signal {signum}", "a second one"))
            # os.write, not print: the handler may run inside a print to the same stream
            os.write(2, f"\nagentrl: {name}: stopping at the end of this step ({again} stops it now)\n".encode())
        return
    _raised = signum
    _raise(signum)


def install() -> None:
    """Route SIGINT and SIGTERM through this module's handler; only the main thread can (elsewhere: nothing).

    SIGINT keeps an ignored disposition (a background job's): only Python's default Ctrl-C handler is replaced.
    """
    if not _main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    if getattr(sys.unraisablehook, "__name__", "") != _quiet_swallowed.__name__:
        _quiet_swallowed.previous = sys.unraisablehook  # type: ignore[attr-defined]
        sys.unraisablehook = _quiet_swallowed


def _quiet_swallowed(unraisable: Any) -> None:
    """Python's report of an exception it had to ignore, less our own signals': those are raised again at the
    next stop point (`_raise_swallowed`), and their traceback through a library's cleanup would only alarm."""
    global _swallowed
    if _raised is not None and isinstance(unraisable.exc_value, KeyboardInterrupt):
        _swallowed = _raised
        return
    _quiet_swallowed.previous(unraisable)  # type: ignore[attr-defined]


def _raise_pending() -> None:
    global _pending
    if _pending is not None:
        signum, _pending = _pending, None
        _raise(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _deferring(kind: str) -> Iterator[None]:
    """A section of `kind` on the main thread (other threads never get the signals); raises a signal deferred in
    it when the last section of either kind closes."""
    if not _main_thread():
        yield
        return
    _open[kind] += 1
    try:
        yield
    finally:
        _open[kind] -= 1
        if not any(_open.values()):
            _raise_pending()


def held() -> AbstractContextManager[None]:
    """Defer Ctrl-C and SIGTERM to the end of the block: a write to the store."""
    return _deferring("write")


def between_steps() -> AbstractContextManager[None]:
    """A training loop's body: Ctrl-C and SIGTERM wait for its next `stop_point()` (or the block's end)."""
    return _deferring("loop")


def stop_point() -> None:
    """Where a training loop may stop: raises the Ctrl-C or SIGTERM that arrived since, if any."""
    if _main_thread() and not _open["write"]:
        _raise_pending()
        _raise_swallowed()


def swallowed_point() -> None:
    """Where work with no stop points of its own (an eval's chunks of tasks) may stop: raises a Ctrl-C or SIGTERM
    that Python reported ignored in a library's cleanup; a deferred one still waits for its loop's stop point."""
    if _main_thread() and not _open["write"] and _swallowed is not None:
        _raise_swallowed()


def _raise_swallowed() -> None:
    global _raised, _swallowed
    if _raised is not None:
        signum, _raised, _swallowed = _raised, None, None
        name = _NAMES.get(signum, (f"signal {signum}",))[0]
        os.write(2, f"\nagentrl: {name} was swallowed by a library's cleanup code; stopping here\n".encode())
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
