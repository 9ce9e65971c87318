"""A step's rollout metrics (`train/reward`, `train/grade`, `rollout/*`): the reward and grade of what was played
(`rollout_metrics`, with `breakdown_means`) and the groups dropped and kept (`drop_metrics`), the same under the
built-in GRPO trainer and the TRL backend (`StepBatch.metrics`); and, measured by the built-in trainer, how stale
the plays' weights were (`weight_lag`) and the play's long tail (`tail_seconds`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.agents.base import multi_agent_metrics
from agentrl.agents.record import Rollout
from agentrl.play.policies import MAIN
from agentrl.rewards import rubric_metrics


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
