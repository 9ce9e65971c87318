"""Steps that train nothing: counted, warned about on the console while the run goes, summed up at its end.

A step makes no update when every group it played was dropped (all failed, or all without a reward signal) or
nothing trainable was played. Its metrics then read `train/updates=0`, `train/tokens=0`, `train/loss=0`, which
looks like a quiet step: the run went on and exited 0, its eval drifting. `NoUpdateWatch` reads each step's
metrics (the built-in trainer's and the TRL backend's share the keys), warns once a few steps in a row made
no update, says why from the step's drop and failure counts, and gives the end-of-run block its line.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

log = logging.getLogger(__name__)

UPDATES = "train/updates"
DROPPED = "rollout/groups_dropped/"
FLAGGED = "rollout/flagged/"
# Failures that are the policy's own doing: under model_failures=drop one of them drops its whole group.
MODEL_FAILURES = ("truncated", "over_budget", "max_turns")


def step_updates(metrics: Mapping[str, float]) -> float:
    """Optimizer updates a step made, over every trained policy (`train/updates`, `train/<policy>/updates`)."""
    return sum(float(v) for k, v in metrics.items() if k.startswith("train/") and k.endswith("/updates"))


class NoUpdateWatch:
    """Counts steps without an update; warns when `warn_after` in a row made none (and again each time that
    streak doubles). `penalize` says whether `trainer.model_failures=penalize` is on offer (trainer=grpo and trl)."""

    def __init__(self, warn_after: int = 2, *, penalize: bool = True) -> None:
        self.warn_after, self.penalize = max(1, int(warn_after)), penalize
        self.steps = self.idle = self.streak = 0
        self.first_idle: int | None = None
        self.dropped: Counter[str] = Counter()  # groups dropped on idle steps, by reason
        self.flagged: Counter[str] = Counter()  # summed shares of flagged rollouts on idle steps, by kind

    def add(self, step: int, metrics: Mapping[str, float]) -> None:
        """One step's metrics (a step that logged no `train/updates` is not counted)."""
        if UPDATES not in metrics:
            return
        self.steps += 1
        if step_updates(metrics) > 0:
            self.streak = 0
            return
        self.idle += 1
        self.streak += 1
        self.first_idle = step if self.streak == 1 else self.first_idle
        self.dropped.update({k[len(DROPPED):]: int(v) for k, v in metrics.items() if k.startswith(DROPPED)})
        self.flagged.update({k[len(FLAGGED):]: float(v) for k, v in metrics.items() if k.startswith(FLAGGED)})
        if self.streak >= self.warn_after and self.streak & (self.streak - 1) == 0:  # 2, 4, 8, ...
            log.warning("steps %d-%d made no optimizer update (train/updates=0): %s", self.first_idle, step,
                        self.reason())

    def reason(self) -> str:
        """Why the idle steps trained nothing, and what to change."""
        if not self.dropped:
            return "no group held a trainable rollout (every role frozen or external?)"
        counts = ", ".join(f"{k} {v}" for k, v in self.dropped.most_common())
        said = f"every group was dropped ({counts})"
        if self.dropped.most_common(1)[0][0] != "failed":
            return (f"{said}: every group's rewards were equal, so no advantage to learn from; start from a model "
                    "that sometimes earns a reward (a longer trainer.warm_start.steps), or sample more widely "
                    "(trainer.temperature, trainer.samples_per_prompt)")
        kind, share = self.flagged.most_common(1)[0] if self.flagged else ("", 0.0)
        mean = share / max(self.idle, 1)
        if kind in MODEL_FAILURES:
            fixes = ["trainer.model_failures=penalize (such a rollout then stays in its group at reward 0)"] \
                if self.penalize else []
            fixes += ["a larger agent.max_response_tokens", "a longer warm start (trainer.warm_start.steps)"]
            return (f"{said}: {mean:.0%} of rollouts were flagged {kind}, and one such rollout drops its whole "
                    f"group; try {', or '.join(fixes)}")
        if kind:
            return f"{said}: {mean:.0%} of rollouts were flagged {kind} (the first one's warning above says why)"
        return said

    def metrics(self) -> dict[str, float]:
        """`train/no_update_steps`: how many of the steps run made no update (logged once, at the end)."""
        return {"train/no_update_steps": float(self.idle)} if self.steps else {}

    def closing_lines(self) -> list[str]:
        """The end-of-run block's lines: none when every step made an update."""
        if not self.idle:
            return []
        return [f"no update     {self.idle} of {self.steps} steps trained nothing: {self.reason()}"]
