"""The producer of `trainer.max_staleness=K`: step batches played ahead of the learner, as far as K allows.

`next()` hands out step n's batch. With K = 0 each batch is played when asked for, on the newest weights. With
K >= 1 one background thread plays the steps in order (so rows are drawn in order and the seeds stay per step)
and keeps every finished batch until the learner takes it. Which step it may start (`admitted`) is the
`trainer.stale_policy`:

- wait: step m starts once the learner has taken batch m - K. A batch's plays start on the weights of the step
  the learner is training, so nothing trained is more than K versions old; generation stops while it waits.
- pace: step m starts once the learner has taken batch m - 1: rows are admitted exactly as fast as the learner
  consumes them, whatever K allows (staleness at most 1; the learner waits on any slow play).
- drop: step m starts once the learner has taken batch m - K - 1: generation never waits on the bound, only on a
  buffer one batch deeper, and the trainer drops the groups that aged past K (`staleness.py`).

Nothing is played past `last`. `held_s(step)` and `producer_idle()` report how long the bound held generation
back and the share of the learner's last step that the producer spent not playing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from agentrl.config.staleness import STALE_POLICIES

T = TypeVar("T")


def lead(policy: str, max_staleness: int) -> int:
    """How many steps past the last one taken the producer may start under `policy` (0: it plays nothing ahead)."""
    if max_staleness == 0:
        return 0
    return {"wait": max_staleness, "pace": 1, "drop": max_staleness + 1}[policy]


class PlayAhead(Iterator[T], Generic[T]):
    """Batches for steps `first`, `first + 1`, ... from `play(step)`, played up to `lead(policy, K)` ahead."""

    def __init__(self, play: Callable[[int], T], *, first: int, last: int, max_staleness: int,
                 policy: str = "wait", clock: Callable[[], float] = time.monotonic) -> None:
        if policy not in STALE_POLICIES:
            raise ValueError(f"stale_policy={policy!r}: choose one of {', '.join(STALE_POLICIES)}")
        self.play, self.last, self.clock = play, last, clock
        self.ahead = lead(policy, max_staleness)
        self.first, self.step = first, first  # `step`: the step whose batch `next()` hands out
        self.taken = first - 1  # the last step handed out
        self.started = first - 1  # the last step the producer began to play
        self._ready: dict[int, T] = {}
        self._failed: dict[int, BaseException] = {}
        self._held: dict[int, float] = {}  # step -> seconds the bound held its start back
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._playing_since: float | None = None  # when the play in progress began (None: none in progress)
        self._busy_s = 0.0  # seconds spent playing, finished plays only
        self._mark: tuple[float, float] | None = None  # (time, busy seconds) at the last hand-out
        self._idle: float | None = None

    # ------------------------------------------------------------------ the producer thread

    def _admitted(self, step: int) -> bool:
        return step <= self.taken + self.ahead

    def _produce(self) -> None:
        for step in range(self.first, self.last + 1):
            with self._cond:
                asked = self.clock()
                held = not self._admitted(step)
                while not self._admitted(step) and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                self._held[step] = self.clock() - asked if held else 0.0
                self.started = step
                self._playing_since = began = self.clock()
            try:
                batch, failure = self.play(step), None
            except BaseException as exc:  # noqa: BLE001 - handed to the learner when it asks for this step
                batch, failure = None, exc
            with self._cond:
                self._busy_s += self.clock() - began
                self._playing_since = None
                if failure is not None:
                    self._failed[step] = failure
                else:
                    self._ready[step] = batch  # type: ignore[assignment]
                self._cond.notify_all()
            if failure is not None:
                return

    def _busy(self, now: float) -> float:
        return self._busy_s + (now - self._playing_since if self._playing_since is not None else 0.0)

    # ------------------------------------------------------------------ the learner's side

    def __next__(self) -> T:
        step, self.step = self.step, self.step + 1
        if self.ahead == 0:  # played then trained, on the caller's thread
            self.taken = self.started = step
            began = self.clock()
            self._held[step] = 0.0
            batch = self.play(step)
            self._busy_s += self.clock() - began
            self._note_handout()
            return batch
        with self._cond:
            if self._thread is None:  # started by the first request: an eval before step 1 plays alone
                self._mark = (self.clock(), 0.0)
                self._thread = threading.Thread(target=self._produce, name="agentrl-rollouts", daemon=True)
                self._thread.start()
            while step not in self._ready and step not in self._failed:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the rollout producer stopped before playing step {step}")
                self._cond.wait(timeout=1.0)
            if step in self._failed:
                raise self._failed.pop(step)
            batch = self._ready.pop(step)
            self.taken = step
            self._note_handout()
            self._cond.notify_all()
        return batch

    def _note_handout(self) -> None:
        """The producer's idle share since the previous hand-out (the learner's last step, as the producer saw it)."""
        now = self.clock()
        busy = self._busy(now)
        if self._mark is not None and now > self._mark[0]:
            self._idle = max(0.0, 1.0 - (busy - self._mark[1]) / (now - self._mark[0]))
        self._mark = (now, busy)

    def held_s(self, step: int) -> float:
        """Seconds the staleness bound held back the start of `step`'s play (0: it started when it could)."""
        return self._held.get(step, 0.0)

    def producer_idle(self) -> float | None:
        """The share of the time between the last two hand-outs that nothing was being played (None: unknown)."""
        return self._idle

    def settle(self) -> None:
        """Wait until the producer is held by the bound or done: an eval or the shutdown gets a quiet engine."""
        with self._cond:
            while (self._thread is not None and self._thread.is_alive() and
                   (self._playing_since is not None or (self.started < self.last and self._admitted(self.started + 1)
                                                        and not self._closing))):
                self._cond.wait(timeout=1.0)

    def close(self) -> None:
        """Let the play in flight finish (its failure is moot once the run ends), then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
