"""The pieces of a training step that the built-in GRPO trainer and the TRL backend share.

`RowStream` is the seeded draw order (TRL's dataset is the same order), `fill_step` draws, plays and filters until
a step is full, `rollout_metrics` and `weight_lag` are the step's rollout metrics under both backends, and
`checkpoint_root` is where either backend writes its checkpoints. How a request samples is `Plan.sampling`.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.agents.base import multi_agent_metrics
from agentrl.agents.record import Rollout
from agentrl.play.policies import MAIN
from agentrl.rewards import rubric_metrics
from agentrl.trainers.common.resume import own_checkpoint_path

if TYPE_CHECKING:
    from agentrl.config.schema import RunConfig


class RowStream:
    """Train-row indices: a fresh seeded permutation every epoch, read through a cursor (saved in checkpoints)."""

    def __init__(self, count: int, seed: int, cursor: int = 0) -> None:
        self.count, self.seed, self.cursor = count, seed, cursor
        self._epoch = -1
        self._order: list[int] = []

    def next(self) -> int:
        epoch, pos = divmod(self.cursor, self.count)
        if epoch != self._epoch:
            self._order = list(range(self.count))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        self.cursor += 1
        return self._order[pos]


def fill_step(draw: Callable[[], int], play: Callable[[list[int], int], list[list[Rollout]]], *, want: int,
              budget: int, drop: Callable[[list[Rollout]], str | None]
              ) -> tuple[list[list[Rollout]], list[Rollout], Counter[str], int]:
    """Draw and play rows until `want` groups pass the filter (`drop` returns None) or `budget` rows were drawn.

    Returns (kept groups, every rollout played, dropped groups by reason, rows drawn). Each round draws only as
    many rows as groups are still missing, so a step never trains on more than `want` groups.
    """
    kept: list[list[Rollout]] = []
    seen: list[Rollout] = []
    dropped: Counter[str] = Counter()
    drawn = attempt = 0
    while len(kept) < want and drawn < budget:
        indices = [draw() for _ in range(min(want - len(kept), budget - drawn))]
        drawn += len(indices)
        for group in play(indices, attempt):
            seen += group
            reason = drop(group)
            if reason is None:
                kept.append(group)
            else:
                dropped[reason] += 1
        attempt += 1
    return kept, seen, dropped, drawn


def checkpoint_root(settings: RunConfig, run_id: str | None) -> Path:
    """`trainer.checkpoint_path`, else `<paths.checkpoint_dir>/<task_name>/<run id>` (`settings`: `Plan.settings`)."""
    if own := own_checkpoint_path(settings):
        return Path(own)
    return Path(settings.paths.checkpoint_dir) / settings.task_name / (run_id or "no-run")


def breakdown_means(rollouts: Sequence[Rollout], prefix: str, breakdown: Mapping[str, str] | None,
                    value: Callable[[Rollout], float]) -> dict[str, float]:
    """`<prefix>/<name>`: the mean `value` of the rollouts by each task fact in `breakdown` (fact -> metric name,
    `{}` standing for the fact's value: `Bundle.eval_breakdown` / `train_breakdown`); rows without it are left out."""
    out: dict[str, float] = {}
    for fact, name in (breakdown or {}).items():
        by_value: dict[Any, list[float]] = defaultdict(list)
        for r in rollouts:
            found = ((r.row or {}).get("metadata", {}).get("task") or {}).get(fact)
            if found is not None:
                by_value[found].append(value(r))
        for found, values in sorted(by_value.items()):
            out[f"{prefix}/{name.format(found)}"] = sum(values) / len(values)
    return out


def rollout_metrics(seen: list[Rollout], breakdown: Mapping[str, str] | None = None) -> dict[str, float]:
    """A step's rollout metrics: train reward (also by the bundle's `train_breakdown`, e.g. env=mix's
    train/reward/<group>), the env's own grade (`train/grade`, whatever the reward group makes of it), flagged
    shares by failure, invalid calls, model tokens."""
    n = max(len(seen), 1)
    flagged = Counter(r.failure.value for r in seen if r.failure is not None)
    metrics = {"train/reward": sum(r.reward for r in seen) / n, "train/grade": sum(r.grade for r in seen) / n,
               "rollout/flagged": sum(flagged.values()) / n,
               "rollout/invalid_tool_calls": sum(r.invalid_calls for r in seen) / n,
               "rollout/model_tokens": float(sum(r.model_tokens for r in seen))}
    metrics.update({f"rollout/flagged/{k}": v / n for k, v in flagged.items()})
    metrics.update(breakdown_means(seen, "train", breakdown, lambda r: r.reward))
    metrics.update(rubric_metrics(seen, "train"))  # reward=rubric: each part's mean (train/rubric/<part>)
    if any(r.role != "agent" for r in seen):
        metrics.update(multi_agent_metrics(seen))
    return metrics


def drop_metrics(dropped: Counter[str], *, drawn: int, kept: int) -> dict[str, float]:
    """`rollout/groups_dropped` (and by reason), `rollout/rows_drawn`, `rollout/groups_kept`."""
    metrics = {"rollout/groups_dropped": float(sum(dropped.values())), "rollout/rows_drawn": float(drawn),
               "rollout/groups_kept": float(kept)}
    metrics.update({f"rollout/groups_dropped/{k}": float(v) for k, v in dropped.items()})
    return metrics


def weight_lag(played: list[Rollout], now: int | None) -> dict[str, float]:
    """`rollout/weight_lag`: how many weight versions behind the engine's current one (`now`) the shared policy's
    trained turns were sampled (0 when played then trained; about 1 with `max_staleness=1`)."""
    versions = [v for r in played if r.policy == MAIN and r.sample is not None
                for v in r.sample.metadata.get("weight_versions", ()) if v is not None]
    return {"rollout/weight_lag": now - sum(versions) / len(versions)} if now is not None and versions else {}


def tail_seconds(ends: Sequence[float]) -> float:
    """The long tail of one `play_rows` call whose plays ended at `ends`: the seconds from the moment half its
    plays had ended to the moment the last did. Through the tail fewer than half the plays are still running, so
    the engine serves a shrinking batch while the step waits for its slowest episodes."""
    if not ends:
        return 0.0
    ordered = sorted(ends)
    return ordered[-1] - ordered[(len(ordered) - 1) // 2]  # from the median end (the lower one of an even count)
