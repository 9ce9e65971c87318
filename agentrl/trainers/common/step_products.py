"""What a training step makes: the batch it trains on (`StepBatch`) and what it reports (`StepStats`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agentrl.agents.record import Rollout
from agentrl.trainers.common.rollout_metrics import drop_metrics, rollout_metrics


@dataclass
class StepBatch:
    """One step's plays after the group filter: what the update trains on, and what was drawn and dropped."""

    step: int
    kept: list[list[Rollout]]  # the groups that passed the filter: the update's samples
    played: list[Rollout]  # every rollout played for the step, dropped groups' included (the step's metrics)
    dropped: Counter[str]  # dropped groups by reason (group_filter.FAILED, NO_SIGNAL)
    rows_drawn: int
    row_cursor: int  # the row stream's cursor after this step's draws: a checkpoint of this step resumes there
    played_from: int | None  # the engine's weight version when the play began (None: the engine has none)
    generate_s: float  # the play's own wall seconds (hidden behind the previous update when played ahead)
    # of generate_s, the seconds fewer than half of a play call's episodes were still running (None: not measured)
    tail_s: float | None = None
    # The bundle's `train_breakdown` (task fact -> metric name): env=mix's train/reward/<group>.
    breakdown: dict[str, str] = field(default_factory=dict)

    @property
    def trained(self) -> list[Rollout]:
        """The kept groups' rollouts, flat."""
        return [r for group in self.kept for r in group]

    def metrics(self) -> dict[str, float]:
        """`train/reward`, `rollout/*` (`rollout/tail_share`: the share of the play spent in its long tail, see
        `rollout_metrics.tail_seconds`) and `time/generate_s` of the plays."""
        metrics = rollout_metrics(self.played, self.breakdown)
        metrics.update(drop_metrics(self.dropped, drawn=self.rows_drawn, kept=len(self.kept)))
        metrics["time/generate_s"] = self.generate_s
        if self.tail_s is not None:  # the built-in trainer measures it; TRL's generation does not say
            metrics["rollout/tail_share"] = self.tail_s / self.generate_s if self.generate_s > 0 else 0.0
        return metrics


@dataclass
class StepTimes:
    """Wall seconds of one step: waiting for its plays, the update, the weight push, the whole step."""

    generate_wait_s: float = 0.0
    train_s: float = 0.0
    weight_push_s: float = 0.0
    step_s: float = 0.0


@dataclass
class StepStats:
    """A step's report: the plays' metrics, the update's per policy, the times; `as_metrics()` for the tracker."""

    step: int
    batch: StepBatch
    update: dict[str, float]  # train/* (the shared policy) and train/<policy>/* (a role's own model)
    times: StepTimes
    extra: dict[str, float] = field(default_factory=dict)  # the weight lag, the bundle's own state (env/level)

    @property
    def reward(self) -> float:
        """The mean reward over every rollout played (`train/reward`)."""
        return self.as_metrics()["train/reward"]

    @property
    def updates(self) -> float:
        """The shared policy's optimizer updates this step (0: every group dropped)."""
        return float(self.update.get("train/updates", 0.0))

    def as_metrics(self) -> dict[str, float]:
        """Every metric, keyed as the tracker logs them."""
        metrics = self.batch.metrics()
        metrics.update(self.extra)
        metrics.update(self.update)
        t = self.times
        metrics.update({"time/generate_wait_s": t.generate_wait_s, "time/train_s": t.train_s,
                        "time/weight_push_s": t.weight_push_s, "time/step_s": t.step_s,
                        "perf/generate_tokens_per_s": metrics["rollout/model_tokens"] / max(self.batch.generate_s,
                                                                                           1e-9),
                        "perf/train_tokens_per_s": metrics.get("train/tokens", 0.0) / max(t.train_s, 1e-9)})
        return metrics
