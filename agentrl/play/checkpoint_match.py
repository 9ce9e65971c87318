"""Matches against a fixed earlier checkpoint: how a self-play model does against, e.g., its own warm start.

A self-play eval split (`env.eval_opponent=null`: the agent is asked for every seat) is played with one seat by
the model under test (the run's shared policy) and every other seat by the frozen checkpoint, on an engine and a
session server of its own (a frozen role model, `policies.py`). The seat of the model under test alternates with
the match index (match i: seat i % seats), as the scripted opponents' matches do; each match scores that seat's
outcome (1 win, 0.5 draw, 0 loss). A match cut short (a failed call, `agent.max_turns`) scores 0, so against a copy
of itself a model scores 0.5 in expectation only when no match is cut short.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from agentrl.config.sampling import Sampling
from agentrl.config.schema import RunConfig
from agentrl.play.policies import plan_policies
from agentrl.play.rollout import make_row

PREFIX = "checkpoint"  # checkpoint/reward, checkpoint/reward_seat<k>, checkpoint/wins_minus_losses, ...


def checkpoint_problem(settings: RunConfig) -> str | None:
    """Why these run settings cannot play matches against a checkpoint, or None: the eval split must be
    self-play and the agent must have a role per seat."""
    if (opponent := getattr(settings.env, "eval_opponent", None)) is not None:
        return (f"env.eval_opponent={opponent}: matches against a checkpoint need a self-play eval "
                "split (env.eval_opponent=null), whose every seat the agent plays")
    if len(settings.agent.role_list()) < 2:
        return "matches against a checkpoint need an agent with a role per seat (agent=self_play)"
    return None


def match_metrics(scores: dict[int, float], seats: int, prefix: str = PREFIX) -> dict[str, float]:
    """Mean score ± se, wins minus losses per match ± se (2 x score - 1: a zero-sum two-player game), the win,
    draw and loss shares, and the mean by the tested model's seat."""
    values = list(scores.values())
    n = len(values)
    if not n:
        return {}
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / max(n - 1, 1) / n)
    out = {f"{prefix}/reward": mean, f"{prefix}/reward_stderr": se, f"{prefix}/wins_minus_losses": 2 * mean - 1,
           f"{prefix}/wins_minus_losses_stderr": 2 * se, f"{prefix}/win_share": sum(v == 1 for v in values) / n,
           f"{prefix}/draw_share": sum(v == 0.5 for v in values) / n, f"{prefix}/loss_share": sum(v == 0 for v in values) / n}
    for seat in range(seats):
        mine = [v for i, v in scores.items() if i % seats == seat]
        if mine:
            out[f"{prefix}/reward_seat{seat}"] = sum(mine) / len(mine)
    return out


def checkpoint_matches(plan: Any, model_path: str, opponent_path: str, *, sampling: Sampling, limit: int | None = None,
                       seed_parts: tuple[Any, ...] = ()) -> tuple[dict[str, float], dict[int, float]]:
    """Play the eval split's matches (the first `limit`) between `model_path` and the frozen `opponent_path`,
    seats alternating by match index: (`match_metrics`, the tested model's score per match index).

    Raises ValueError (`checkpoint_problem`) when the plan's eval split is not self-play."""
    from agentrl.play.services import start_services  # torch loads only when matches are played

    settings: RunConfig = plan.settings
    problem = checkpoint_problem(settings)
    if problem:
        raise ValueError(problem)
    names = [r.name for r in settings.agent.role_list()]
    split = settings.env.eval_split
    scores: dict[int, float] = {}
    for seat, name in enumerate(names):
        # The first `limit` matches, not an eval subset: seats go by index, so these hold each seat equally.
        first = range(min(limit, plan.bundle.splits()[split]) if limit is not None else plan.bundle.splits()[split])
        indices = [i for i in first if i % len(names) == seat]
        if not indices:
            continue
        opponents = [{"name": other, "model": opponent_path, "frozen": True} for other in names if other != name]
        services = start_services(plan, model_path, plan_policies(opponents))
        try:
            rows = [make_row(plan.bundle, split, i, services.env_url, services.env_settings) for i in indices]
            groups = asyncio.run(services.runner.play_rows(rows, 1, request_kwargs=sampling.request_kwargs(),
                                                           seed_parts=(*seed_parts, PREFIX)))
        finally:
            services.close()
        for index, group in zip(indices, groups, strict=True):
            # A match cut short (a failed model call, max_turns) flags every seat: no outcome, scored 0.
            scores[index] = next((float(r.score) for r in group if r.role == name), 0.0)
    return match_metrics(scores, len(names)), dict(sorted(scores.items()))
