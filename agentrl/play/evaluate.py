"""Evaluation by playing real episodes: one play per eval task, scored by the env's grader.

A task's eval reward is the score of its play's outcome (`outcome_of`): the one rollout of a tool-calling play;
for a judged play (co-evolution) the selected answer's score, unweighted, and 0 when the play exited before
selecting. Eval reads `Rollout.score`, never the trained (weighted) `reward`; beside it `<prefix>/grade` is the
env's own grade of the same outcomes (`Rollout.grade`), which means the same under every reward choice (under
reward=rubric `<prefix>/reward` is the rubric's total). Plays with several roles also
report each role's mean score (`eval/reward_<role>`, e.g. the solvers' own mean).
Each evaluation prints one line as it ends (`eval_line`), so a run's progress shows without MLflow, and hands
its per-task records (`eval_results`) to a sink that writes `evals/<name>.jsonl` and logs the eval table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from agentrl.agents.record import Rollout
from agentrl.config.sampling import Sampling
from agentrl.config.schema import RunConfig
from agentrl.interrupts import swallowed_point
from agentrl.play.episode_traces import TraceAs
from agentrl.play.eval_results import majority_metrics, pass_metrics, task_records
from agentrl.play.eval_subset import eval_indices, eval_subset  # noqa: F401 - eval_indices: its old home
from agentrl.play.rollout import make_row
from agentrl.rewards import rubric_metrics


def outcome_of(group: Sequence[Rollout]) -> Rollout:
    """The rollout that stands for a row's play, its `score` the play's: a judged play's rollout that
    `holds_outcome` (the selector, scored by its selected answer), or a copy of it (or of the first rollout)
    scored 0 when the play exited before its outcome; else the first rollout (tool_calling's only one)."""
    if not any(r.judged for r in group):
        return group[0]
    holder = next((r for r in group if r.holds_outcome), None)
    if holder is not None and not holder.early_exit:
        return holder
    return dataclasses.replace(holder or group[0], score=0.0, reward=0.0, env_reward=None, scores=None)


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


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / max(n - 1, 1) / n)


def play_metrics(played: Sequence[Rollout], plays: Sequence[Sequence[Rollout]], prefix: str) -> dict[str, float]:
    """What the plays did, whatever the reward makes of it: `<prefix>/grade` (the env's own grade of each outcome,
    `Rollout.grade`) and its standard error; `<prefix>/tool_call_rate` (the share of plays with a valid tool call)
    and `<prefix>/tool_calls_per_play`; `<prefix>/failure_share` and `<prefix>/failure/<kind>` (the share of
    outcomes flagged with each `Failure` kind that occurred)."""
    if not played:
        return {}
    grade, grade_se = _mean_se([r.grade for r in played])
    out = {f"{prefix}/grade": grade, f"{prefix}/grade_stderr": grade_se}
    if plays:
        out[f"{prefix}/tool_call_rate"] = sum(any(r.tool_calls for r in p) for p in plays) / len(plays)
        out[f"{prefix}/tool_calls_per_play"] = sum(r.tool_calls for p in plays for r in p) / len(plays)
    kinds = Counter(r.failure.value for r in played if r.failure is not None)
    out[f"{prefix}/failure_share"] = sum(kinds.values()) / len(played)
    out.update({f"{prefix}/failure/{kind}": n / len(played) for kind, n in sorted(kinds.items())})
    return out


def _differs(metrics: Mapping[str, float], a: str, b: str) -> bool:
    return a in metrics and b in metrics and abs(metrics[a] - metrics[b]) > 1e-9


def eval_line(metrics: Mapping[str, float], seconds: float, *, prefix: str = "eval", step: int | None = None,
              subset: str = "") -> str:
    """One line for an evaluation: step, mean reward ± its standard error (and the env's own grade when a reward
    group makes the two differ), zero share, tool-call rate, failures, which tasks (`subset`), seconds."""
    at = f"step {step} " if step is not None else ""
    nan = float("nan")
    parts = [f"{at}{prefix}/reward {metrics.get(f'{prefix}/reward', nan):.3f} "
             f"± {metrics.get(f'{prefix}/reward_stderr', nan):.3f}"]
    if _differs(metrics, f"{prefix}/grade", f"{prefix}/reward"):  # reward=rubric: the rubric's total above
        parts.append(f"{prefix}/grade {metrics[f'{prefix}/grade']:.3f} ± {metrics[f'{prefix}/grade_stderr']:.3f} "
                     "(the env's own)")
    parts.append(f"zero share {metrics.get(f'{prefix}/zero_share', nan):.2f}")
    if f"{prefix}/tool_call_rate" in metrics:
        parts.append(f"tool calls in {metrics[f'{prefix}/tool_call_rate']:.0%} of plays")
    if failures := failure_note(metrics, prefix):
        parts.append(failures)
    if subset:
        parts.append(subset)
    return f"{', '.join(parts)}, {seconds:.1f} s"


def failure_note(metrics: Mapping[str, float], prefix: str = "eval") -> str:
    """`failed 12% (truncated 10%, max_turns 2%)`, or "" when no play failed."""
    share = metrics.get(f"{prefix}/failure_share", 0.0)
    if not share:
        return ""
    head = f"{prefix}/failure/"
    kinds = sorted(((v, k[len(head):]) for k, v in metrics.items() if k.startswith(head)), reverse=True)
    return f"failed {share:.0%} ({', '.join(f'{kind} {v:.0%}' for v, kind in kinds)})"


# A step's progress line: (metric, label, format) of what it shows when the step logged it.
STEP_FIELDS = (("train/reward", "train/reward", "{:.3f}"), ("train/loss", "loss", "{:.4g}"),
               ("train/tokens", "tokens", "{:.0f}"), ("rollout/groups_kept", "groups kept", "{:.0f}"),
               ("train/lr", "lr", "{:.3g}"), ("time/step_s", "", "{:.1f} s"))


def step_line(name: str, step: int, steps: int | None, metrics: Mapping[str, float]) -> str:
    """One line for a training step (the run's log holds one per step; the console shows a progress bar)."""
    parts = [f"{label} {fmt.format(float(metrics[key]))}".strip() for key, label, fmt in STEP_FIELDS
             if key in metrics]
    return f"{name} step {step}{f'/{steps}' if steps else ''}: {', '.join(parts)}"


def plays_of(group: Sequence[Rollout]) -> list[list[Rollout]]:
    """A row's rollouts split into its plays (by `play_id`), in play order."""
    plays: dict[str, list[Rollout]] = {}
    for r in group:
        plays.setdefault(r.play_id, []).append(r)
    return list(plays.values())


def play_tasks(services: Any, rows: Sequence[dict[str, Any]], *, samples: int, sampling: Sampling,
               seed_parts: tuple[Any, ...], chunk: int = 64, progress: tqdm | None = None,
               trace_as: TraceAs | None = None) -> list[list[list[Rollout]]]:
    """Play each row `samples` times; per row, its plays (each a list of rollouts). `progress` (a tqdm bar, one
    unit a task) advances as chunks finish and shows the running mean score."""
    kwargs = sampling.request_kwargs()
    per_row: list[list[list[Rollout]]] = []
    scores: list[float] = []
    step = max(1, chunk // samples)  # bounded concurrency: the engine batches up to its limit anyway
    for start in range(0, len(rows), step):
        groups = asyncio.run(services.runner.play_rows(rows[start:start + step], samples, request_kwargs=kwargs,
                                                       seed_parts=seed_parts, trace_as=trace_as))
        for group in groups:
            plays = plays_of(group)
            per_row.append(plays)
            scores += [outcome_of(p).score for p in plays]
        if progress is not None and scores:
            progress.update(len(groups))
            progress.set_postfix_str(f"mean {sum(scores) / len(scores):.3f}")
        swallowed_point()  # else a Ctrl-C that a library's cleanup swallowed lets the eval play on to its end
    return per_row


def evaluate(services: Any, bundle: Any, split: str, *, limit: int | None, sampling: Sampling,
             seed_parts: tuple[Any, ...] = (), prefix: str = "eval", chunk: int = 64, step: int | None = None,
             quiet: bool = False, samples: int = 1, pass_score: float = 1.0, sink: Any = None,
             progress: tqdm | None = None) -> tuple[dict[str, float], list[Rollout]]:
    """Play every eval task `samples` times, sampled as `sampling` says; returns (metrics, the outcome rollouts in
    task order). With more than one sample the metrics add `<prefix>/pass_at_<k>` (a pass: score >= `pass_score`)
    and `<prefix>/maj_at_<k>` (the majority answer's score; `majority_metrics`).

    `sink(name, records)` (an `eval_results.EvalSink`) takes the per-task records, named `<prefix>-step-<step>`
    (or `<prefix>` without a step; a `/` in the prefix becomes `-`). Prints `eval_line` when done (above any
    progress bar) unless `quiet`.
    """
    started = time.monotonic()
    subset = eval_subset(bundle, split, limit)
    rows = [make_row(bundle, split, i, services.env_url, services.env_settings) for i in subset.indices]
    per_row = play_tasks(services, rows, samples=samples, sampling=sampling, seed_parts=(*seed_parts, prefix),
                         chunk=chunk, progress=progress, trace_as=TraceAs(prefix, step or 0))
    every = [play for plays in per_row for play in plays if play]
    outcomes = [[outcome_of(p) for p in plays if p] for plays in per_row]
    played = [r for per_task in outcomes for r in per_task]
    breakdown = bundle.eval_breakdown
    metrics = reward_metrics(played, prefix, breakdown)
    metrics.update(play_metrics(played, every, prefix))
    metrics.update(role_metrics(every, prefix))
    metrics.update(rubric_metrics(played, prefix))  # reward=rubric: eval/rubric/<part>
    records = task_records(outcomes, breakdown, step)
    if samples > 1:
        metrics.update(pass_metrics(records, pass_score, prefix))
        metrics.update(majority_metrics(records, prefix))
    if sink is not None:  # a file name of the prefix: warm_start/eval writes warm_start-eval-step-<n>.jsonl
        name = prefix.replace("/", "-")
        sink(name if step is None else f"{name}-step-{step}", records)
    if not quiet:  # above any progress bar, and at once even when stdout is a pipe
        tqdm.write(eval_line(metrics, time.monotonic() - started, prefix=prefix, step=step, subset=subset.note),
                   file=sys.stdout)
        sys.stdout.flush()
    return metrics, played


def trainer_eval(services: Any, bundle: Any, settings: RunConfig, step: int, *, sampling: Sampling, greedy: bool,
                 times: dict[str, float], history: dict[str, list[tuple[int, float]]],
                 sink: Any = None) -> dict[str, float]:
    """A trainer's eval at `step`, sampled as training samples (the plan's `sampling`) or greedy-decoded:
    the same call for every backend, so `eval/*` compares across them. `settings` is the run's typed config
    (`Plan.settings`). Adds its seconds to `times["eval"]` and a sampled eval's reward to `history["eval/reward"]`.
    `sink` (an `eval_results.EvalSink`) takes its per-task results (`evals/eval-step-<n>.jsonl`)."""
    started = time.monotonic()
    metrics, _ = evaluate(services, bundle, settings.env.eval_split, limit=settings.trainer.eval_limit,
                          sampling=sampling.greedy_copy() if greedy else sampling,
                          seed_parts=(settings.seed, step), prefix="eval_greedy" if greedy else "eval", step=step,
                          sink=sink)
    seconds = time.monotonic() - started
    times["eval"] += seconds
    if not greedy:
        metrics["time/eval_s"] = seconds
        history["eval/reward"].append((step, metrics["eval/reward"]))
    return metrics
