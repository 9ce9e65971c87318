"""The `local` sandbox: episodes live in the server's process; their methods run in a thread pool.

The pool's threads are daemons, so a tool stuck past its timeout can never keep the process alive
at exit (a `ThreadPoolExecutor` joins its workers at interpreter exit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from agentrl.envs.sandbox.base import EpisodeHandle, Sandbox, SandboxError
from agentrl.envs.task import Bundle, Episode, ToolResult, Turn

log = logging.getLogger(__name__)


class DaemonPool(concurrent.futures.Executor):
    """A fixed pool of daemon worker threads."""

    def __init__(self, workers: int, name: str = "agentrl-local") -> None:
        if workers < 1:
            raise ValueError(f"a pool needs at least one worker, not {workers}")
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future, Callable, tuple] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                fut.set_exception(exc)

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("the pool is shut down")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        call = (lambda: fn(*args, **kwargs)) if kwargs else fn
        self._jobs.put((fut, call, () if kwargs else args))
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for t in self._threads:
                t.join()


class LocalEpisodeHandle(EpisodeHandle):
    """One in-process episode. Calls are serialised, so the episode never runs on two threads at once."""

    def __init__(self, episode: Episode, pool: DaemonPool, on_close: Callable[[LocalEpisodeHandle], None],
                 *, inline: bool = False):
        self.episode = episode
        self._inline = inline
        self.task_id = episode.info.task_id
        self._pool = pool
        self._lock = asyncio.Lock()
        self._inflight: concurrent.futures.Future | None = None
        self._closed = False
        self._on_close = on_close
        # Filled in the same thread hop as the call that produced them, to save a hop each.
        self._first_turn: Turn | None = None
        self._final_scores: dict[str, float] | None = None

    async def _run(self, fn: Callable, *args: Any) -> Any:
        async with self._lock:
            if self._closed:
                raise SandboxError(f"episode {self.task_id} is closed")
            if self._inline:
                return fn(*args)
            fut = self._pool.submit(fn, *args)
            self._inflight = fut
            # A cancelled waiter (a tool timeout) leaves the thread running; close() waits for it.
            return await asyncio.wrap_future(fut)

    async def first_turn(self) -> Turn:
        turn, self._first_turn = self._first_turn, None
        return turn if turn is not None else await self._run(self.episode.first_turn)

    def _settle(self) -> None:
        """On the worker thread, after a call: an episode that is over has final scores; keep them."""
        if self.episode.done:
            self._final_scores = self.episode.scores()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        def call() -> ToolResult:
            result = self.episode.call_tool(name, arguments)
            self._settle()
            if not result.done and self._final_scores is not None:
                # A call that used the last submission ends the episode, whatever the tool said.
                result = ToolResult(result.text, result.is_error, True)
            return result

        return await self._run(call)

    async def end_turn(self, response: str) -> Turn | None:
        def end() -> Turn | None:
            turn = self.episode.end_turn(response)
            if turn is None:
                self._final_scores = self.episode.scores()
            return turn

        return await self._run(end)

    async def done(self) -> bool:
        return self._final_scores is not None or await self._run(lambda: self.episode.done)

    async def scores(self) -> dict[str, float]:
        if self._final_scores is not None:
            return dict(self._final_scores)
        return await self._run(self.episode.scores)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_close(self)
        closer = getattr(self.episode, "close", None)
        if not callable(closer):
            return

        def safe_close() -> None:
            try:
                closer()
            except Exception:  # close never raises
                log.exception("closing episode %s failed", self.task_id)

        if self._inline:
            safe_close()
            return
        busy = self._inflight
        if busy is not None and not busy.done():
            # A stuck call still owns the episode: close it on the pool once that call returns.
            busy.add_done_callback(lambda _f: self._pool.submit(safe_close) if not self._pool._closed else None)
            return
        try:
            await asyncio.wrap_future(self._pool.submit(safe_close))
        except RuntimeError:  # the pool is gone (shutdown raced us): close inline
            safe_close()


class LocalSandbox(Sandbox):
    """Runs episodes of `bundle` in this process; each Episode method runs on a daemon thread pool, or on the
    event loop itself when the bundle declares `inline_episodes` (microsecond, non-blocking methods)."""

    def __init__(self, bundle: Bundle, *, workers: int = 16) -> None:
        self.bundle = bundle
        self._workers = workers
        self._pool: DaemonPool | None = None
        self._live: set[LocalEpisodeHandle] = set()

    async def start(self) -> None:
        if self._pool is None:
            self._pool = DaemonPool(self._workers)

    async def deploy(self, split: str, index: int) -> EpisodeHandle:
        if self._pool is None:
            await self.start()
        assert self._pool is not None

        def start() -> tuple[Episode, Turn]:
            # The opening turn comes in the same hop as the episode: one thread round trip per reset.
            episode = self.bundle.episode(split, index)
            return episode, episode.first_turn()

        inline = bool(getattr(self.bundle, "inline_episodes", False))
        try:
            episode, turn = start() if inline else await asyncio.wrap_future(self._pool.submit(start))
        except (IndexError, KeyError):
            raise
        except Exception as exc:
            raise SandboxError(f"starting task {index} of split {split!r} failed: {exc!r}") from exc
        handle = LocalEpisodeHandle(episode, self._pool, self._live.discard, inline=inline)
        handle._first_turn = turn
        self._live.add(handle)
        return handle

    @property
    def live(self) -> int:
        """How many episodes are deployed and not yet closed."""
        return len(self._live)

    async def health(self) -> dict[str, Any]:
        return {"status": "healthy", "kind": "local", "episodes": len(self._live)}

    async def shutdown(self) -> None:
        for handle in list(self._live):
            await handle.close()
        if self._pool is not None:
            # Workers are daemons: do not wait for one stuck in a tool.
            self._pool.shutdown(wait=False)
            self._pool = None
