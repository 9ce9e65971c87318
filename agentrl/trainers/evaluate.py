"""Evaluation by playing real episodes: one play per eval task, scored by the env's grader.

A task's eval reward is the score of its play's outcome (`outcome_of`): the one rollout of a tool-calling play;
for a judged play (co-evolution) the selected answer's score, unweighted, and 0 when the play exited before
selecting. Eval reads `Rollout.score`, never the trained (weighted) `reward`. Plays with several roles also
report each role's mean score (`eval/reward_<role>`, e.g. the solvers' own mean).
Each evaluation prints one line as it ends (`eval_line`), so a run's progress shows without MLflow.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from agentrl.agents.record import Rollout
from agentrl.config.sampling import Sampling
from agentrl.config.schema import RunConfig
from agentrl.trainers.rollout import make_row


def eval_indices(bundle: Any, split: str, limit: int | None) -> list[int]:
    """The first `limit` task indices of `split` (all when limit is None)."""
    count = bundle.splits()[split]
    return list(range(count if limit is None else min(int(limit), count)))


def outcome_of(group: Sequence[Rollout]) -> Rollout:
    """The rollout that stands for a row's play, its `score` the play's: a judged play's rollout that
    `holds_outcome` (the selector, scored by its selected answer), or a copy of it (or of the first rollout)
    scored 0 when the play exited before its outcome; else the first rollout (tool_calling's only one)."""
    if not any(r.judged for r in group):
        return group[0]
    holder = next((r for r in group if r.holds_outcome), None)
    if holder is not None and not holder.early_exit:
        return holder
    return dataclasses.replace(holder or group[0], score=0.0, reward=0.0)


def role_metrics(groups: Sequence[Sequence[Rollout]], prefix: str) -> dict[str, float]:
    """`<prefix>/reward_<role>`: each role's mean score, for plays with more than one role."""
    by_role: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        for r in group:
            by_role[r.role].append(r.score)
    if len(by_role) < 2:
        return {}
    return {f"{prefix}/reward_{role}": sum(rs) / len(rs) for role, rs in sorted(by_role.items())}


def reward_metrics(played: list[Rollout], prefix: str, breakdown: Mapping[str, str] | None = None) -> dict[str, float]:
    """Mean score (`<prefix>/reward`), its standard error, the share of zeros, and the mean by each task fact the
    bundle breaks its eval down by (`Bundle.eval_breakdown`: fact -> metric name, `{}` standing for the value)."""
    if not played:
        return {}
    rewards = [p.score for p in played]
    n = len(rewards)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / max(n - 1, 1)
    out = {f"{prefix}/reward": mean, f"{prefix}/reward_stderr": math.sqrt(var / n),
           f"{prefix}/zero_share": sum(r == 0 for r in rewards) / n}
    for fact, name in (breakdown or {}).items():
        by_value: dict[Any, list[float]] = defaultdict(list)
        for p in played:
            value = (p.row["metadata"].get("task") or {}).get(fact)
            if value is not None:
                by_value[value].append(p.score)
        for value, rs in sorted(by_value.items()):
            out[f"{prefix}/{name.format(value)}"] = sum(rs) / len(rs)
    return out


def eval_line(metrics: Mapping[str, float], seconds: float, *, prefix: str = "eval", step: int | None = None) -> str:
    """One line for an evaluation: step, mean reward ± its standard error, zero share, tasks' seconds."""
    at = f"step {step} " if step is not None else ""
    return (f"{at}{prefix}/reward {metrics.get(f'{prefix}/reward', float('nan')):.3f} "
            f"± {metrics.get(f'{prefix}/reward_stderr', float('nan')):.3f}, "
            f"zero share {metrics.get(f'{prefix}/zero_share', float('nan')):.2f}, {seconds:.1f} s")


# A step's progress line: (metric, label, format) of what it shows when the step logged it.
STEP_FIELDS = (("train/reward", "train/reward", "{:.3f}"), ("train/loss", "loss", "{:.4g}"),
               ("train/tokens", "tokens", "{:.0f}"), ("rollout/groups_kept", "groups kept", "{:.0f}"),
               ("train/lr", "lr", "{:.3g}"), ("time/step_s", "", "{:.1f} s"))


def step_line(name: str, step: int, steps: int | None, metrics: Mapping[str, float]) -> str:
    """One line for a training step (the run's log holds one per step; the console shows a progress bar)."""
    parts = [f"{label} {fmt.format(float(metrics[key]))}".strip() for key, label, fmt in STEP_FIELDS
             if key in metrics]
    return f"{name} step {step}{f'/{steps}' if steps else ''}: {', '.join(parts)}"


def evaluate(services: Any, bundle: Any, split: str, *, limit: int | None, sampling: Sampling,
             seed_parts: tuple[Any, ...] = (), prefix: str = "eval",
             chunk: int = 64, step: int | None = None, quiet: bool = False) -> tuple[dict[str, float], list[Rollout]]:
    """Play every eval task once, sampled as `sampling` says; returns (metrics, the rollouts in task order).

    Prints `eval_line` when done (above any progress bar) unless `quiet`; `step` only labels that line.
    """
    started = time.monotonic()
    rows = [make_row(bundle, split, i, services.env_url, services.env_settings)
            for i in eval_indices(bundle, split, limit)]
    kwargs = sampling.request_kwargs()
    every: list[list[Rollout]] = []
    for start in range(0, len(rows), chunk):  # bounded concurrency: the engine batches up to its limit anyway
        groups = asyncio.run(services.runner.play_rows(rows[start:start + chunk], 1, request_kwargs=kwargs,
                                                       seed_parts=(*seed_parts, prefix)))
        every += [g for g in groups if g]
    played = [outcome_of(g) for g in every]
    metrics = reward_metrics(played, prefix, getattr(bundle, "eval_breakdown", None))
    metrics.update(role_metrics(every, prefix))
    if not quiet:  # above any progress bar, and at once even when stdout is a pipe
        tqdm.write(eval_line(metrics, time.monotonic() - started, prefix=prefix, step=step), file=sys.stdout)
        sys.stdout.flush()
    return metrics, played


def trainer_eval(services: Any, bundle: Any, settings: RunConfig, step: int, *, sampling: Sampling, greedy: bool,
                 times: dict[str, float], history: dict[str, list[tuple[int, float]]]) -> dict[str, float]:
    """A trainer's eval at `step`, sampled as training samples (the plan's `sampling`) or greedy-decoded:
    the same call for every backend, so `eval/*` compares across them. `settings` is the run's typed config
    (`Plan.settings`). Adds its seconds to `times["eval"]` and a sampled eval's reward to `history["eval/reward"]`."""
    started = time.monotonic()
    metrics, _ = evaluate(services, bundle, settings.env.eval_split, limit=settings.trainer.eval_limit,
                          sampling=sampling.greedy_copy() if greedy else sampling,
                          seed_parts=(settings.seed, step), prefix="eval_greedy" if greedy else "eval", step=step)
    seconds = time.monotonic() - started
    times["eval"] += seconds
    if not greedy:
        metrics["time/eval_s"] = seconds
        history["eval/reward"].append((step, metrics["eval/reward"]))
    return metrics
