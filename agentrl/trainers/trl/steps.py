"""`trainer=trl`'s steps as agentrl's typed step products, so a TRL step reports what a built-in GRPO step reports.

TRL's loop runs the step; agentrl sees three moments of it. `rollout_func` plays the step's rows: `gather_step`
turns every rank's plays into one `StepBatch` (a collective: each rank calls it). The step ends (`on_step_end`):
its `StepTimes`. TRL logs the update (`on_log`): `step_stats` makes the step's `StepStats` from the three, which
the callback keeps (`Bridge.stats`) and sends to the sink as `as_metrics()`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.agents.record import Rollout
from agentrl.interrupts import stop_point
from agentrl.trainers.common.step_products import StepBatch, StepStats, StepTimes

# TRL's log keys that mean what one of ours means (TRL's own names are kept beside, under trl/).
SAME_MEANING = {"loss": "train/loss", "grad_norm": "train/grad_norm", "kl": "train/kl",
                "clip_ratio/region_mean": "train/clip_fraction", "entropy": "train/entropy"}


@dataclass
class PlayedStep:
    """One `rollout_func` call over every rank: the step's batch, the model tokens TRL trains on (mask 1), and
    the seconds the weight push took before the plays."""

    batch: StepBatch
    trained_tokens: int
    push_s: float


def _light(rollout: Rollout) -> Rollout:
    """The rollout as the step's metrics need it: its counts, reward and failure, its task's facts (the bundle's
    train_breakdown) and its sample's mask (model tokens), without the token ids, the messages or the transcript a
    gather would otherwise copy between ranks."""
    sample = rollout.sample
    if sample is not None:
        sample = dataclasses.replace(sample, token_ids=[], rollout_logprobs=[], metadata={}, turn_boundaries=[])
    task = (rollout.row.get("metadata") or {}).get("task")
    return dataclasses.replace(rollout, row={"metadata": {"task": task}}, sample=sample, details={}, transcript=[])


def gather_step(step: int, groups: Sequence[Sequence[Rollout]], reasons: Sequence[str | None], *,
                trained_tokens: int, push_s: float, generate_s: float, played_from: int | None,
                row_cursor: int, breakdown: Mapping[str, str] | None = None) -> PlayedStep:
    """Every rank's plays of `step` as one `StepBatch`: `groups` are this rank's (a row's group may be split
    across ranks: each rank's part counts as a group, kept or dropped for `reasons[i]`). All ranks call this;
    the seconds are this rank's own. `breakdown`: the bundle's `train_breakdown` (env=mix: train/reward/<group>)."""
    from accelerate.utils import gather_object

    parts = gather_object([([[_light(r) for r in g] for g in groups], list(reasons), trained_tokens)])
    kept: list[list[Rollout]] = []
    played: list[Rollout] = []
    dropped: Counter[str] = Counter()
    drawn = 0
    for rank_groups, rank_reasons, _ in parts:
        for group, reason in zip(rank_groups, rank_reasons, strict=True):
            played += group
            drawn += 1
            if reason is None:
                kept.append(group)
            else:
                dropped[reason] += 1
    batch = StepBatch(step, kept, played, dropped, drawn, row_cursor=row_cursor, played_from=played_from,
                      generate_s=generate_s, breakdown=dict(breakdown or {}))
    return PlayedStep(batch, sum(part[2] for part in parts), push_s)


def step_times(played: PlayedStep, step_s: float) -> StepTimes:
    """A TRL step's times: it waits for all its plays (TRL plays, then trains), pushes before them, trains in the
    rest of the step."""
    gen, push = played.batch.generate_s, played.push_s
    return StepTimes(generate_wait_s=gen, train_s=max(step_s - gen - push, 0.0), weight_push_s=push, step_s=step_s)


def update_metrics(logs: Mapping[str, float], played: PlayedStep, *, kl_coef: float) -> dict[str, float]:
    """The update's `train/*`: TRL's logged values under our names, the tokens trained, and whether the step
    updated anything."""
    update = {ours: float(logs[theirs]) for theirs, ours in SAME_MEANING.items() if theirs in logs}
    if "loss" in logs and "kl" not in logs and kl_coef == 0:
        update["train/kl"] = 0.0  # TRL computes no KL without beta; the built-in trainer logs 0 then
    update["train/tokens"] = float(played.trained_tokens)
    # TRL steps its optimizer whatever it is given; with every group masked out (failed) or without signal that
    # step moves nothing, so it counts as no update, as under trainer=grpo (trainers/common/no_update.py).
    update["train/updates"] = float(bool(played.batch.kept) and played.trained_tokens > 0)
    return update


def step_stats(step: int, played: PlayedStep, logs: Mapping[str, float], times: StepTimes, *,
               kl_coef: float) -> StepStats:
    """The step's report, as the built-in GRPO step makes it; TRL's own log keys ride along as `trl/<key>`."""
    return StepStats(step, played.batch, update_metrics(logs, played, kl_coef=kl_coef), times,
                     extra={f"trl/{k}": float(v) for k, v in logs.items()})


def make_callback(bridge: Any, trainer_ref: list[Any]) -> Any:
    """A TrainerCallback that turns each TRL step into a `StepStats` (kept as `bridge.stats`), runs our evals on
    their cadence, and sends both to `bridge.sink` (rank 0's)."""
    from transformers import TrainerCallback

    class AgentrlCallback(TrainerCallback):
        def __init__(self) -> None:
            self.started = 0.0
            self.times: StepTimes | None = None  # the ended step's, until TRL logs its update
            self.evals: dict[str, float] = {}

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            stop_point()  # after the last step's log and checkpoint (agentrl/interrupts.py)
            self.started = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            step, t = state.global_step, bridge.t
            step_s = time.monotonic() - self.started
            bridge.times["train"] += step_s
            if bridge.played is None:
                return
            self.times = step_times(bridge.played, step_s)
            bridge.history["train/reward"].append((step, bridge.played.batch.metrics()["train/reward"]))
            if state.is_world_process_zero and (step == t.steps or (t.eval_every and step % t.eval_every == 0)):
                self.evals = bridge.evaluate(trainer_ref[0], step)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            numbers = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)}
            if self.times is not None and bridge.played is not None:  # the step's update: its report
                bridge.stats = step_stats(state.global_step, bridge.played, numbers, self.times,
                                          kl_coef=bridge.t.kl_coef)
                # reward=rubric's judge/* counters: this rank's judge (each rank builds its own reward group)
                metrics = {**bridge.stats.as_metrics(), **bridge.plan.reward.metrics(), **self.evals}
                self.times, self.evals = None, {}
            else:  # TRL's closing summary (train_runtime, ...): its own keys only
                metrics = {f"trl/{k}": v for k, v in numbers.items()}
            if state.is_world_process_zero and bridge.sink is not None:
                bridge.sink(metrics, state.global_step)

    return AgentrlCallback()
