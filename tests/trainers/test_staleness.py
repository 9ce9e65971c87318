"""The staleness bound (`trainer.max_staleness=K`, `trainer.stale_policy`) on a scripted engine whose weight
versions the test sets: the real producer (`PlayAhead`) plays scripted steps, the real accounting
(`staleness.py`) ages and drops them, and the version moves exactly when a step "pushes"."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from agentrl.agents.record import Rollout
from agentrl.inference.sessions.samples import Sample
from agentrl.trainers.grpo.play_ahead import PlayAhead, lead
from agentrl.trainers.grpo.staleness import play_staleness, split_stale, staleness_metrics


def _rollout(first: int | None, *, policy: str = "main", play_id: str | None = None, resumed: int = 0) -> Rollout:
    meta = {"weight_versions": [first], "first_weight_version": first, "resumed_turns": resumed}
    r = Rollout(policy=policy, sample=Sample([1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.2], metadata=meta))
    if play_id is not None:
        r.play_id = play_id
    return r


class ScriptedEngine:
    """The weight version a play starts on; `push()` is a trained step's weight update."""

    def __init__(self) -> None:
        self.version = 0
        self.started: list[tuple[int, int]] = []  # (step, version its play started on)

    def play(self, step: int) -> list[list[Rollout]]:
        self.started.append((step, self.version))
        return [[_rollout(self.version), _rollout(self.version)]]

    def push(self) -> None:
        self.version += 1


def run(policy: str, k: int, steps: int = 6) -> tuple[ScriptedEngine, list[dict[str, float]], list[int]]:
    """Train `steps` scripted steps; returns the engine, each step's staleness metrics, each step's lead seen
    after the producer settled (steps started past the one trained)."""
    engine = ScriptedEngine()
    ticks: Iterator[int] = itertools.count()
    ready = PlayAhead(engine.play, first=1, last=steps, max_staleness=k, policy=policy,
                      clock=lambda: float(next(ticks)))
    metrics, leads = [], []
    try:
        for step in range(1, steps + 1):
            groups = next(ready)
            ready.settle()  # whatever the policy admits is played now, on this step's (pre-push) weights
            leads.append(ready.started - step)
            now = {"main": engine.version}
            plays = play_staleness([r for g in groups for r in g], now)
            fresh, stale = split_stale(groups, now, k, plays) if policy == "drop" else (groups, [])
            m = staleness_metrics([r for g in fresh for r in g], plays, dropped_groups=len(stale))
            m["held_s"] = ready.held_s(step)
            metrics.append(m)
            engine.push()
    finally:
        ready.close()
    return engine, metrics, leads


def test_wait_plays_k_steps_ahead_and_holds_generation_at_the_bound() -> None:
    engine, metrics, leads = run("wait", 2)
    assert [s for s, _ in engine.started] == [1, 2, 3, 4, 5, 6]  # in order, each once, nothing past the last
    assert leads == [2, 2, 2, 2, 1, 0]  # K steps ahead until the last step
    # A fast producer sits at the bound: from step 3 on every trained sample is exactly K versions old.
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert all(m["async/dropped_stale"] == 0 for m in metrics)
    assert all(m["held_s"] > 0 for m in metrics[3:]), metrics  # steps 4.. waited for the learner to catch up


def test_max_staleness_1_plays_exactly_the_old_one_step_overlap() -> None:
    """K=1 (wait) is the former off_policy_steps=1: step n+1 starts on the weights step n trains from."""
    engine, metrics, leads = run("wait", 1, steps=4)
    assert engine.started == [(1, 0), (2, 0), (3, 1), (4, 2)]
    assert leads == [1, 1, 1, 0]
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]


def test_k0_plays_each_step_when_asked_on_the_newest_weights() -> None:
    engine, metrics, leads = run("wait", 0, steps=3)
    assert engine.started == [(1, 0), (2, 1), (3, 2)]
    assert leads == [0, 0, 0] and all(m["async/staleness_max"] == 0 for m in metrics)


def test_pace_admits_one_step_per_step_trained_whatever_k_allows() -> None:
    engine, metrics, leads = run("pace", 3)
    assert max(leads) == 1  # never more than one batch in hand, though K=3 would allow three
    assert max(m["async/staleness_max"] for m in metrics) == 1.0
    assert all(m["async/dropped_stale"] == 0 for m in metrics)


def test_drop_never_holds_generation_and_drops_what_aged_past_k() -> None:
    engine, metrics, leads = run("drop", 1)
    assert leads[:4] == [2, 2, 2, 2]  # one batch deeper than the bound: the producer does not wait on it
    assert all(m["held_s"] == 0 for m in metrics[:2])
    # Step 3 was started on version 0 while step 1 trained: 2 versions old when trained, over K=1: dropped.
    dropped = [m["async/dropped_stale"] for m in metrics]
    assert dropped[0] == dropped[1] == 0 and dropped[2] == 1, dropped
    assert all("async/staleness_max" not in m or m["async/staleness_max"] <= 1 for m in metrics)  # trained ones


def test_a_play_is_as_stale_as_its_oldest_first_token_across_roles_and_engines() -> None:
    """Two roles of one play on their own engines: the solver's first token is 4 versions behind its engine, so
    the group holding the other role's (1 version old) rollout goes under K=2 too."""
    proposer = _rollout(2, play_id="p1")
    solver = _rollout(1, policy="solver", play_id="p1")
    other = _rollout(3, play_id="p2")
    now = {"main": 3, "solver": 5}
    assert play_staleness([proposer, solver, other], now) == {"p1": 4, "p2": 0}
    fresh, stale = split_stale([[proposer], [other], [solver]], now, 2)
    assert fresh == [[other]] and stale == [[proposer], [solver]]


def test_metrics_count_resumed_partial_rollouts_and_skip_samples_without_versions() -> None:
    trained = [_rollout(1, resumed=2), _rollout(2), _rollout(None)]
    plays = play_staleness(trained, {"main": 3})
    m = staleness_metrics(trained, plays, dropped_groups=0)
    assert m["async/resumed_partial"] == 1.0
    assert m["async/staleness_mean"] == 1.5 and m["async/staleness_max"] == 2.0


def test_a_failed_play_reaches_the_learner_at_its_step() -> None:
    def play(step: int) -> int:
        if step == 2:
            raise OSError("engine gone")
        return step

    ready = PlayAhead(play, first=1, last=3, max_staleness=2)
    try:
        assert next(ready) == 1
        with pytest.raises(OSError, match="engine gone"):
            next(ready)
    finally:
        ready.close()


def test_the_bound_and_policy_are_checked_and_the_old_key_names_its_heir() -> None:
    from agentrl.config.trainer import GRPOTrainerConfig, TRLTrainerConfig

    with pytest.raises(ValueError, match=r"off_policy_steps was renamed trainer.max_staleness.*max_staleness=1"):
        GRPOTrainerConfig(off_policy_steps=1)
    with pytest.raises(ValueError, match=r"off_policy_steps was renamed trainer.max_staleness"):
        TRLTrainerConfig(off_policy_steps=0)
    with pytest.raises(ValueError, match=r"trainer.max_staleness must be an integer >= 0"):
        GRPOTrainerConfig(max_staleness=-1)
    with pytest.raises(ValueError, match=r"trainer.stale_policy='later': choose one of wait, pace, drop"):
        GRPOTrainerConfig(stale_policy="later")
    assert [lead(p, 0) for p in ("wait", "pace", "drop")] == [0, 0, 0]
    assert [lead(p, 3) for p in ("wait", "pace", "drop")] == [3, 1, 4]


def test_miles_refuses_k_at_plan_time_naming_its_flag() -> None:
    from agentrl.config.algorithm import miles_algorithm_problem
    from agentrl.config.trainer import MilesTrainerConfig

    problem = miles_algorithm_problem(MilesTrainerConfig(max_staleness=0))
    assert problem is None
    with pytest.raises(ValueError, match=r"max_staleness=2 does not apply under trainer=miles.*--max-weight-staleness"):
        MilesTrainerConfig(max_staleness=2)


def test_the_long_tail_runs_from_the_median_end_to_the_last() -> None:
    from agentrl.trainers.common.rollout_metrics import tail_seconds

    # Five plays: three end by t=12, the stragglers at 15 and 20: fewer than half run from 12 on.
    assert tail_seconds([20.0, 11.0, 12.0, 15.0, 11.5]) == pytest.approx(8.0)
    # Four plays: the tail starts at the second end (half have ended), not between the two middle ones.
    assert tail_seconds([1.0, 2.0, 3.0, 9.0]) == pytest.approx(7.0)
    assert tail_seconds([4.0, 4.0, 4.0]) == 0.0  # all end together: no tail
    assert tail_seconds([6.0]) == 0.0  # one play is its own median
    assert tail_seconds([]) == 0.0
