"""What the engines that sample on servers elsewhere (`inference=vllm`, `inference=sglang`) share: the admission
gate that a weight push closes and one HTTP client per event loop (the folders a push writes: `weight_folders.py`).

The gate is the push's safety: a push closes admission, waits until every running call has finished on the old
weights, loads the new ones on every server, then re-opens it. So no call of the next step samples from weights
older than the push, and none of this step's is cut short.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentrl.http import async_client
from agentrl.inference.engines.completion import EngineUnavailable


class Admission:
    """Counts calls per server, sends each to the least busy one that is up, and holds new calls while closed."""

    def __init__(self, urls: list[str], engine: str) -> None:
        self.engine = engine  # named in the error a call gets once the engine is closed
        self.in_flight = dict.fromkeys(urls, 0)
        self.cond = threading.Condition()
        self.admitting, self.closed = True, False
        self.down: set[str] = set()  # servers being restarted: no call goes there meanwhile
        self.failure: EngineUnavailable | None = None  # why no call can be served any more (a dead server)

    def admit(self, block: bool) -> str | None:
        """Count the call on the least busy server that is up and return its URL; while a push holds admission
        closed or every server is down, wait (`block`) or return None."""
        with self.cond:
            while True:
                if self.closed or self.failure is not None:
                    raise self.failure or EngineUnavailable(f"{self.engine} is closed")  # the session server: 503
                up = [u for u in self.in_flight if u not in self.down]
                if self.admitting and up:
                    url = min(up, key=lambda u: self.in_flight[u])
                    self.in_flight[url] += 1
                    return url
                if not block:
                    return None
                self.cond.wait()

    async def acquire(self) -> str:
        """`admit` without blocking the event loop: the calls it is running must finish for a push to proceed."""
        return self.admit(block=False) or await asyncio.to_thread(self.admit, True)

    def release(self, url: str) -> None:
        with self.cond:
            self.in_flight[url] -= 1
            self.cond.notify_all()

    @contextmanager
    def paused(self, timeout: float | None) -> Iterator[None]:
        """Close admission and wait for the running calls to finish (TimeoutError past `timeout` s); re-open on
        leaving, whatever happened inside."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            if self.failure is not None:
                raise self.failure
            self.admitting = False
            try:
                while any(self.in_flight.values()):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("in-flight generations did not finish before the weight update")
                    self.cond.wait(left)
            except BaseException:
                self._reopen()
                raise
        try:
            yield
        finally:
            with self.cond:
                self._reopen()

    def _reopen(self) -> None:
        self.admitting = True
        self.cond.notify_all()

    def fail(self, exc: EngineUnavailable) -> None:
        """Every waiting and later call gets `exc` (the first failure wins)."""
        with self.cond:
            self.failure = self.failure or exc
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class LoopClients:
    """One pooled async HTTP client per event loop (a client is bound to the loop that made it)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = async_client(timeout=self.timeout)
            self._clients[loop] = client
        return client
