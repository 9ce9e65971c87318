"""Evaluation by playing real episodes: one rollout per eval task, scored by the env's grader."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from typing import Any

from agentrl.trainers.rollout import Played, make_row


def eval_indices(bundle: Any, split: str, limit: int | None) -> list[int]:
    """The first `limit` task indices of `split` (all when limit is None)."""
    count = bundle.splits()[split]
    return list(range(count if limit is None else min(int(limit), count)))


def reward_metrics(played: list[Played], prefix: str) -> dict[str, float]:
    """Mean reward, its standard error, the share of zero rewards, and the mean by battery duration (GridSim)."""
    if not played:
        return {}
    rewards = [p.reward for p in played]
    n = len(rewards)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / max(n - 1, 1)
    out = {f"{prefix}/reward": mean, f"{prefix}/reward_stderr": math.sqrt(var / n),
           f"{prefix}/zero_share": sum(r == 0 for r in rewards) / n}
    by_duration: dict[Any, list[float]] = defaultdict(list)
    for p in played:
        duration = (p.row["metadata"].get("task") or {}).get("duration_h")
        if duration is not None:
            by_duration[duration].append(p.reward)
    for duration, rs in sorted(by_duration.items()):
        out[f"{prefix}/reward_{duration}h"] = sum(rs) / len(rs)
    return out


def evaluate(services: Any, bundle: Any, split: str, *, limit: int | None, temperature: float,
             top_p: float = 1.0, seed_parts: tuple[Any, ...] = (), prefix: str = "eval",
             chunk: int = 64) -> tuple[dict[str, float], list[Played]]:
    """Play every eval task once at `temperature` (0: greedy); returns (metrics, the rollouts in task order)."""
    rows = [make_row(bundle, split, i, services.env_url, services.env_settings)
            for i in eval_indices(bundle, split, limit)]
    kwargs: dict[str, Any] = {"temperature": float(temperature), "top_p": float(top_p),
                              "chat_template_kwargs": {"enable_thinking": False}}
    played: list[Played] = []
    for start in range(0, len(rows), chunk):  # bounded concurrency: the engine batches up to its limit anyway
        groups = asyncio.run(services.runner.play_rows(rows[start:start + chunk], 1, request_kwargs=kwargs,
                                                       seed_parts=(*seed_parts, prefix)))
        played += [g[0] for g in groups if g]
    return reward_metrics(played, prefix), played
