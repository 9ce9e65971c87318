"""A run's health summary: the metrics a recipe gives healthy ranges (`agent.health`), checked at the end.

Miles' multi-agent example watches `multi_agent/avg_turns`, `multi_agent/early_termination_rate`,
`multi_agent/conversation_token_count` and `loss_mask/role_split` (a role whose share of the model's tokens nears 1
is a verbose role). The GRPO trainer logs them every step; `HealthWatch` collects them and, at the end of the run,
gives one line that flags each metric whose recent mean lies outside its declared `[low, high]`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

WINDOW = 10  # the summary judges the mean of the last this many steps: one step's value is noisy


@dataclass(frozen=True)
class Finding:
    """One declared metric at the end of a run: its recent mean (nan when never logged) and its range."""

    metric: str
    value: float
    low: float
    high: float

    @property
    def logged(self) -> bool:
        return not math.isnan(self.value)

    @property
    def healthy(self) -> bool:
        return self.logged and self.low <= self.value <= self.high


class HealthWatch:
    """Collects the declared metrics step by step; `summary()` is the end-of-run line."""

    def __init__(self, ranges: Mapping[str, Sequence[float]] | None, window: int = WINDOW) -> None:
        self.ranges = {str(k): (float(v[0]), float(v[1])) for k, v in (ranges or {}).items()}
        self.window = max(1, int(window))
        self.seen: dict[str, list[float]] = {k: [] for k in self.ranges}

    def add(self, metrics: Mapping[str, float]) -> None:
        """Keep this step's values of the declared metrics (a metric a step did not log is skipped)."""
        for name, values in self.seen.items():
            if name in metrics and math.isfinite(float(metrics[name])):
                values.append(float(metrics[name]))

    def findings(self) -> list[Finding]:
        out = []
        for name, (low, high) in self.ranges.items():
            recent = self.seen[name][-self.window:]
            value = sum(recent) / len(recent) if recent else float("nan")
            out.append(Finding(name, value, low, high))
        return out

    def metrics(self) -> dict[str, float]:
        """`health/out_of_range`: how many declared metrics ended outside their range (never-logged ones excluded)."""
        if not self.ranges:
            return {}
        found = self.findings()
        return {"health/out_of_range": float(sum(f.logged and not f.healthy for f in found))}

    def summary(self) -> str:
        """One line: `health: ok` or the metrics outside their range, each with its value and range; "" when
        the recipe declares no ranges (nothing to report: the console stays quiet)."""
        if not self.ranges:
            return ""
        found = self.findings()
        bad = [f for f in found if f.logged and not f.healthy]
        missing = [f.metric for f in found if not f.logged]
        span = f"mean of the last {self.window} steps"
        if bad:
            text = "; ".join(f"{f.metric} {f.value:.3g} outside [{f.low:g}, {f.high:g}]" for f in bad)
            line = f"health: {len(bad)} of {len(found)} metrics OUT OF RANGE ({span}): {text}"
        else:
            line = f"health: ok, {len(found) - len(missing)} of {len(found)} metrics in range ({span})"
        if missing:
            line += f"; never logged: {', '.join(missing)}"
        return line
