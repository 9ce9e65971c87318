"""Answering the turns still running at shutdown with the API's JSON 503, not uvicorn's 500 text/plain.

When uvicorn shuts down it waits `timeout_graceful_shutdown` seconds for open requests, then cancels
them, and a cancelled request is answered "Internal Server Error" as text. The server calls
`Drain.begin(grace_s)` as shutdown starts (`agentrl.uvicorn_servers`'s `on_shutdown` hook); turns still
running shortly before that grace ends stop waiting (their engine request is cancelled, the session
is left as it was) and answer 503 `{"error": ...}`, which uvicorn then sends before it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

MAX_MARGIN_S = 1.0  # answer this long before uvicorn's grace ends (half the grace when it is shorter)


class ServerShuttingDown(RuntimeError):
    """The server is shutting down and the turn did not finish within the grace period (HTTP 503)."""


class Drain:
    """Races each turn against the end of the shutdown grace period."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._over = asyncio.Event()
        self.began = False

    def _event(self) -> asyncio.Event:
        """The current event loop's flag: a server started again runs a new loop, with no shutdown pending."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._over, self.began = loop, asyncio.Event(), False
        return self._over

    def begin(self, grace_s: float | None) -> None:
        """Shutdown started (call on the server's event loop): turns still running at `grace_s` minus a
        margin get `ServerShuttingDown`. None (uvicorn waits forever) lets them finish."""
        over = self._event()
        self.began = True
        if grace_s is None:
            return
        margin = min(MAX_MARGIN_S, grace_s / 2)
        asyncio.get_running_loop().call_later(max(0.0, grace_s - margin), over.set)

    async def guard(self, turn: Awaitable[T]) -> T:
        """`await turn`, unless the grace period ends first: then cancel it and raise ServerShuttingDown."""
        over = asyncio.ensure_future(self._event().wait())
        task = asyncio.ensure_future(turn)
        try:
            await asyncio.wait({task, over}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the handler itself is cancelled
            over.cancel()
            finished = task.done()
            if not finished:
                task.cancel()  # the engine drops a cancelled request; the session is not touched
                task.add_done_callback(_consume)
        if not finished:
            raise ServerShuttingDown("the server is shutting down; the turn was cancelled before it finished")
        return task.result()


def _consume(task: asyncio.Future) -> None:
    with contextlib.suppress(BaseException):
        task.exception()
