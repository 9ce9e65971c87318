"""How stale a step's trained samples are (`trainer.max_staleness`), the groups `stale_policy=drop` removes, and
the step's `async/*` metrics (docs/mlflow.md).

A sample's staleness is the learner's weight version (its policy's engine's, before this step's push) minus the
version that sampled its first token. A play is as stale as its oldest first token, whichever of its roles it
belongs to; a group as its stalest play.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.agents.record import Rollout
from agentrl.inference.sessions.samples import is_resumed

STALE = "stale"  # the group filter's reason for a group dropped by stale_policy=drop (rollout/groups_dropped/stale)


def first_version(sample: Any) -> int | None:
    """The weight version of a sample's first sampled token (None: the engine reports none)."""
    meta = sample.metadata
    if meta.get("first_weight_version") is not None:
        return int(meta["first_weight_version"])
    versions = [v for v in meta.get("weight_versions", ()) if v is not None]
    return int(versions[0]) if versions else None


def play_staleness(rollouts: Sequence[Rollout], now: Mapping[str, int | None]) -> dict[str, int]:
    """play id -> versions between the play's oldest first token and its policy's current version (`now`:
    policy name -> that policy's engine version). Rollouts without a sample or a version are left out."""
    plays: dict[str, int] = {}
    for r in rollouts:
        current = now.get(r.policy)
        first = first_version(r.sample) if r.sample is not None else None
        if current is None or first is None:
            continue
        plays[r.play_id] = max(plays.get(r.play_id, 0), current - first)
    return plays


def split_stale(groups: list[list[Rollout]], now: Mapping[str, int | None], max_staleness: int,
                plays: Mapping[str, int] | None = None) -> tuple[list[list[Rollout]], list[list[Rollout]]]:
    """(fresh groups, groups with a play more than `max_staleness` versions old); `plays` from `play_staleness`
    over every played rollout, so that a play split over groups counts its oldest token in each."""
    ages = plays if plays is not None else play_staleness([r for g in groups for r in g], now)
    fresh: list[list[Rollout]] = []
    stale: list[list[Rollout]] = []
    for group in groups:
        (stale if any(ages.get(r.play_id, 0) > max_staleness for r in group) else fresh).append(group)
    return fresh, stale


def staleness_metrics(trained: Sequence[Rollout], plays: Mapping[str, int], *, dropped_groups: int) -> dict[str, float]:
    """`async/staleness_mean` / `_max` over the trained samples (each as stale as its play), `async/dropped_stale`
    (groups) and `async/resumed_partial` (trained samples a push in keep mode landed inside: H4's partial rollouts)."""
    ages = [plays[r.play_id] for r in trained if r.play_id in plays]
    metrics = {"async/dropped_stale": float(dropped_groups),
               "async/resumed_partial": float(sum(is_resumed(r.sample) for r in trained if r.sample is not None))}
    if ages:
        metrics.update({"async/staleness_mean": sum(ages) / len(ages), "async/staleness_max": float(max(ages))})
    return metrics


class EngineIdle:
    """The engine's idle share between two calls, from its cumulative `stats.idle_s` (engines without it: None)."""

    def __init__(self, engine: Any, clock: Any) -> None:
        self.engine, self.clock = engine, clock
        self.mark = self._read()

    def _read(self) -> tuple[float, float] | None:
        idle = getattr(getattr(self.engine, "stats", None), "idle_s", None)
        return (self.clock(), float(idle)) if isinstance(idle, (int, float)) else None

    def since_last(self) -> float | None:
        """The share of the wall time since the previous call that the engine had no sequence running."""
        now, before = self._read(), self.mark
        self.mark = now
        if now is None or before is None or now[0] <= before[0]:
            return None
        return min(1.0, max(0.0, (now[1] - before[1]) / (now[0] - before[0])))
