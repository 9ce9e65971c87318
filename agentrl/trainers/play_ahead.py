"""The overlap of `trainer.off_policy_steps=1`: an iterator of ready step batches that plays one step ahead.

`next()` hands out step n's batch; with the overlap on it first starts step n+1's play on a background thread,
so that play begins on the weights step n trains from (one version stale when trained) while step n updates.
Without the overlap each batch is played when asked for, on the newest weights. Nothing is played past `last`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class PlayAhead(Iterator[T], Generic[T]):
    """Batches for steps `first`, `first + 1`, ... from `play(step)`; one played ahead when `overlap`."""

    def __init__(self, play: Callable[[int], T], *, first: int, last: int, overlap: bool) -> None:
        self.play, self.last, self.overlap = play, last, overlap
        self.step = first  # the step whose batch `next()` hands out
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-rollouts")
        self.ahead: concurrent.futures.Future[T] | None = None

    def __next__(self) -> T:
        step, self.step = self.step, self.step + 1
        ahead, self.ahead = self.ahead, None
        batch = ahead.result() if ahead is not None else self.play(step)
        if self.overlap and step < self.last:
            self.ahead = self.pool.submit(self.play, step + 1)
        return batch

    def settle(self) -> None:
        """Wait for the play in flight (kept for its step): an eval or the shutdown gets a quiet engine."""
        if self.ahead is not None:
            concurrent.futures.wait([self.ahead])

    def close(self) -> None:
        """Let the play in flight finish (its failure is moot once the run ends), then stop the thread."""
        self.settle()
        self.pool.shutdown()
