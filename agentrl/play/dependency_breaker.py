"""The circuit breaker on a run's dependencies: the env server and the engine (behind its session server).

Why: a rollout that meets a dead env server waits out its own `connect_timeout`, and one that meets a frozen
server (it accepts TCP, never answers) waits out its `reset_timeout` or tool deadline; the group filter then
counts groups, not time, so a run used to go on for half an hour saying nothing. The breaker watches every
finished play and, while plays are in flight, each dependency's `/health`, and trips on the first of:

* **a streak**: `max_failures` plays in a row failed the same way against one dependency (e.g. `model_error`)
  and its `/health`, asked right then, says it is unhealthy (answers an error: an engine whose worker died says
  503). A `/health` that does not answer at all may be a restart: that is left to the grace window;
* **the grace window**: the dependency has been in trouble (a play failed against it, or its `/health` did not
  answer) for `grace_s` seconds of play time with no play succeeding since.

Tripped, `RolloutRunner.play_rows` cancels the plays still in flight (none waits out its own timeout) and, with
`on_loss="stop"`, raises `DependencyLost` naming the dependency and what was seen; with `on_loss="wait"` it
keeps every finished play, waits until the dependency's `/health` answers again, and replays only the plays that
failed against it or were cut (`play_guarded`). Under `wait` a play that failed against a dependency whose
`/health` is down is replayed even before the breaker trips: it is the outage's loss, not the policy's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field

import httpx

from agentrl.agents.record import MODEL_FAILURES, Failure, Rollout
from agentrl.http import async_client
from agentrl.play.failure_notes import FailureNotes

log = logging.getLogger(__name__)

# What each dependency's failure looks like on a rollout.
ENV_FAILURES = frozenset({Failure.ENV_UNREACHABLE, Failure.ENV_GONE, Failure.ENV_AUTH, Failure.DEPLOY,
                          Failure.TOOL_TIMEOUT})
ENGINE_FAILURES = frozenset({Failure.MODEL_GONE, Failure.MODEL_TIMEOUT, Failure.MODEL_ERROR})
PROBE_EVERY_S = 5.0  # how often a dependency's /health is asked while plays are in flight
PROBE_TIMEOUT_S = 5.0  # a /health slower than this counts as not answering (a frozen process never does)
TICK_S = 0.5  # the watch's clock: how late a trip may be noticed
WAIT_NOTICE_S = 60.0  # with on_loss=wait, how often the console is reminded what the run waits for
ON_LOSS = ("stop", "wait")


class DependencyLost(RuntimeError):
    """A dependency of the run stopped answering (the message names it, its URL and what was seen)."""

    def __init__(self, message: str, dependency: str = "", url: str = "") -> None:
        super().__init__(message)
        self.dependency, self.url = dependency, url


@dataclass
class Dependency:
    """One service the plays need, and what the breaker has seen of it."""

    name: str  # "env server", "engine"
    url: str  # its base URL; `/health` is asked there
    failures: frozenset[Failure]  # the rollout failures that blame it
    streak: int = 0  # plays in a row that failed against it the same way
    streak_kind: Failure | None = None
    last_error: str = ""
    trouble_s: float = 0.0  # play time spent in trouble since its last success
    troubled: bool = False
    health: str = ""  # what the last /health probe saw ("" when it answered 200)
    unhealthy: bool = False  # the last probe was answered, with an error status: it says it cannot serve
    went_down: bool = False  # a probe failed since its last success (an outage, not only failing plays)
    last_probe: float = float("-inf")

    @property
    def health_url(self) -> str:
        return f"{self.url.rstrip('/')}/health"

    def succeeded(self) -> None:
        self.streak, self.streak_kind, self.trouble_s, self.troubled, self.went_down = 0, None, 0.0, False, False

    def failed(self, kind: Failure, error: str) -> None:
        self.streak = self.streak + 1 if kind == self.streak_kind else 1
        self.streak_kind, self.last_error, self.troubled = kind, error, True

    def seen(self) -> str:
        """What was seen of it, in words, for the console and the stop message."""
        parts = []
        if self.health:
            parts.append(f"/health {self.health}")
        if self.streak_kind is not None:
            parts.append(f"{self.streak} plays in a row failed {self.streak_kind.value}, the last: "
                         f"{self.last_error[:300] or 'no detail'}")
        return "; ".join(parts) or "no play succeeded"


@dataclass
class Breaker:
    """The rules above over `dependencies`; shared by every `play_rows` call of one run (one process)."""

    dependencies: list[Dependency]
    grace_s: float = 50.0
    max_failures: int = 16
    on_loss: str = "stop"
    notes: FailureNotes | None = None
    abandoned: threading.Event = field(default_factory=threading.Event)  # set at shutdown: stop waiting
    last_tick: float | None = None  # the trouble clocks run only while plays are in flight (`tick`)

    def __post_init__(self) -> None:
        if self.on_loss not in ON_LOSS:
            raise ValueError(f"trainer.on_dependency_loss must be stop or wait, got {self.on_loss!r}")
        if self.grace_s <= 0 or self.max_failures < 1:
            raise ValueError(f"trainer.dependency_grace_s must be > 0 and trainer.max_dependency_failures >= 1, "
                             f"got {self.grace_s} and {self.max_failures}")

    def record(self, rollouts: Sequence[Rollout]) -> None:
        """A finished play: a success for each dependency it ran through, or a failure against one."""
        if self.notes is not None:
            self.notes.saw(rollouts)
        clean = all(r.failure is None or r.failure in MODEL_FAILURES for r in rollouts)
        for dep in self.dependencies:
            blamed = [(r.failure, r.error) for r in rollouts
                      if r.failure is not None and r.failure in dep.failures]
            if blamed:
                kind, error = blamed[0]
                if not dep.troubled:
                    log.warning("%s at %s: a play failed %s (%s); %s", dep.name, dep.url, kind.value,
                                error[:300], self._unless())
                dep.failed(kind, error)
            elif clean:
                if dep.troubled:
                    log.warning("%s at %s: plays succeed again", dep.name, dep.url)
                dep.succeeded()

    def _unless(self) -> str:
        then = "the run stops" if self.on_loss == "stop" else "the run waits for it"
        return (f"{then} (trainer.on_dependency_loss={self.on_loss}) after {self.grace_s:g}s of this without a "
                "success (trainer.dependency_grace_s) unless it recovers")

    def step_done(self, step: int, seen: Sequence[Rollout]) -> None:
        """A trainer's step collected `seen`: the console hears of a high failure share."""
        if self.notes is not None:
            self.notes.step(step, seen)

    async def probe(self, client: httpx.AsyncClient, dep: Dependency) -> bool:
        """Ask `dep`'s /health (PROBE_TIMEOUT_S); True when it answered 200. Not answering is trouble."""
        dep.last_probe = time.monotonic()
        dep.unhealthy = False
        try:
            try:
                response = await client.get(dep.health_url, timeout=PROBE_TIMEOUT_S)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                # A pooled keep-alive connection the server closed just as the probe reused it looks like a
                # disconnect and says nothing of the server: ask once more on a new connection (agentrl.http drops
                # idle connections before uvicorn does; this is the backstop). A dead server fails the second ask.
                response = await client.get(dep.health_url, timeout=PROBE_TIMEOUT_S)
            answer = "" if response.status_code == 200 else \
                f"answered HTTP {response.status_code}: {response.text[:200]}"
            dep.unhealthy = bool(answer)
        except httpx.TimeoutException:
            answer = f"did not answer within {PROBE_TIMEOUT_S:g}s (the process is frozen or overloaded)"
        except httpx.HTTPError as exc:
            answer = f"could not be reached ({type(exc).__name__}: {exc or 'connection failed'})"
        if answer and not dep.troubled:
            log.warning("%s at %s: /health %s; %s", dep.name, dep.url, answer, self._unless())
        dep.health = answer
        dep.troubled = dep.troubled or bool(answer)
        dep.went_down = dep.went_down or bool(answer)
        return not answer

    def tick(self) -> None:
        """Add the play time since the last tick to each troubled dependency's clock."""
        now = time.monotonic()
        if self.last_tick is not None:
            for dep in self.dependencies:
                if dep.troubled:
                    dep.trouble_s += now - self.last_tick
        self.last_tick = now

    def tripped(self) -> Dependency | None:
        """The first dependency past its grace window (the streak rule is checked with a probe, in `watch`)."""
        return next((d for d in self.dependencies if d.troubled and d.trouble_s >= self.grace_s), None)

    async def watch(self) -> Dependency:
        """Run beside the plays: probe, keep the trouble clocks, and return the dependency that trips."""
        async with async_client() as client:
            while True:
                self.tick()
                now = time.monotonic()
                due = [d for d in self.dependencies if now - d.last_probe >= PROBE_EVERY_S]
                answered = await asyncio.gather(*(self.probe(client, d) for d in due))
                for dep, ok in zip(due, answered, strict=True):
                    if dep.streak >= self.max_failures:
                        if dep.unhealthy:
                            return dep
                        if ok:  # it answers: those failures were not its death; the grace window judges
                            dep.streak = 0
                if (tripped := self.tripped()) is not None:
                    return tripped
                await asyncio.sleep(TICK_S)

    def lost(self, dep: Dependency, why: str = "") -> DependencyLost:
        """The stop: one message naming the dependency, what was seen, and the knobs."""
        after = why or ("trainer.on_dependency_loss=wait waits for it to come back instead" if self.on_loss == "stop"
                        else "the run stopped while waiting for it")
        return DependencyLost(
            f"the {dep.name} at {dep.url} stopped answering: {dep.seen()}; in trouble for {dep.trouble_s:.0f}s of "
            f"play time with no play succeeding (trainer.dependency_grace_s={self.grace_s:g}, "
            f"trainer.max_dependency_failures={self.max_failures}); {after}", dep.name, dep.url)

    async def wait_back(self, dep: Dependency) -> None:
        """Poll `dep`'s /health until it answers (on_loss=wait); `abandoned` ends the wait with DependencyLost."""
        log.warning("the %s at %s stopped answering (%s): waiting for its /health to answer "
                    "(trainer.on_dependency_loss=wait)", dep.name, dep.url, dep.seen())
        started = noticed = time.monotonic()
        async with async_client() as client:
            while not await self.probe(client, dep):
                if self.abandoned.is_set():
                    raise self.lost(dep)
                if time.monotonic() - noticed >= WAIT_NOTICE_S:
                    noticed = time.monotonic()
                    log.warning("still waiting for the %s at %s (%.0fs): /health %s", dep.name, dep.url,
                                noticed - started, dep.health)
                await asyncio.sleep(PROBE_EVERY_S)
        log.warning("the %s at %s answers again after %.0fs: replaying the plays it cut", dep.name, dep.url,
                    time.monotonic() - started)
        for d in self.dependencies:
            d.succeeded()


Play = Callable[[Hashable], Awaitable[list[Rollout]]]


async def _round(breaker: Breaker, units: Sequence[Hashable], play: Play,
                 done: dict[Hashable, list[Rollout]]) -> Dependency | None:
    """Play `units` at once, recording each as it ends; the tripped dependency (plays cut), or None."""
    breaker.last_tick = time.monotonic()  # the time between calls (training, an eval's setup) is not play time
    tasks: dict[asyncio.Future[list[Rollout]], Hashable] = {asyncio.ensure_future(play(u)): u for u in units}
    watch = asyncio.ensure_future(breaker.watch())
    pending = set(tasks)
    try:
        while pending:
            finished, _ = await asyncio.wait(pending | {watch}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending & finished:  # the plays that ended (not the watch)
                pending.discard(task)
                done[tasks[task]] = task.result()  # a bug in a play (not a flagged failure) ends the call
                breaker.record(done[tasks[task]])
            if watch in finished:
                return watch.result()
        return None
    finally:
        for task in pending:
            task.cancel()
        watch.cancel()
        await asyncio.gather(*pending, watch, return_exceptions=True)
        breaker.tick()


def _failed_against(dep: Dependency, done: dict[Hashable, list[Rollout]]) -> list[Hashable]:
    return [u for u, rollouts in done.items() if any(r.failure in dep.failures for r in rollouts)]


async def _down_now(breaker: Breaker, done: dict[Hashable, list[Rollout]]) -> list[Hashable]:
    """on_loss=wait, after a round the breaker did not trip: the plays that failed against a dependency whose
    /health does not answer now (an outage, not the play's own fault): they are replayed, not kept as failures."""
    async with async_client() as client:
        down = [d for d in breaker.dependencies if _failed_against(d, done) and not await breaker.probe(client, d)]
    return list(dict.fromkeys(u for d in down for u in _failed_against(d, done)))


async def play_guarded(breaker: Breaker, units: Sequence[Hashable], play: Play) -> dict[Hashable, list[Rollout]]:
    """Every unit's play under the breaker: raises DependencyLost on a trip (on_loss=stop), or waits for the
    dependency and replays what it cut, keeping the finished plays (on_loss=wait)."""
    done: dict[Hashable, list[Rollout]] = {}
    while len(done) < len(units):
        dep = await _round(breaker, [u for u in units if u not in done], play, done)
        if dep is None and breaker.on_loss == "wait" and (retry := await _down_now(breaker, done)):
            for unit in retry:
                del done[unit]
            await asyncio.sleep(PROBE_EVERY_S)  # no hot loop of instant failures: the grace window bounds these
            breaker.tick()
            dep = breaker.tripped()
        if dep is None:
            continue
        if breaker.on_loss == "stop":
            raise breaker.lost(dep)
        async with async_client() as client:
            back = await breaker.probe(client, dep)
        if back and not dep.went_down:  # its plays fail but it never stopped answering: waiting cannot help
            raise breaker.lost(dep, "its /health answers, so waiting for it cannot help")
        for unit in _failed_against(dep, done):
            del done[unit]
        log.warning("%d finished plays kept; %d to replay once the %s is back", len(done), len(units) - len(done),
                    dep.name)
        await breaker.wait_back(dep)
    return done
