"""Failed rollouts on the console as they happen, not only as MLflow metrics.

A failure kind the run has not seen before is logged at WARNING when the play that had it ends (with its
error), and a step whose share of flagged rollouts passes `share` is logged at WARNING with the counts by kind.
The progress bar alone showed a dead env server only as `reward=0.000`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from agentrl.agents.record import Rollout

log = logging.getLogger(__name__)


class FailureNotes:
    """Remembers the failure kinds seen in this process; `share` is the step threshold (0 < share <= 1)."""

    def __init__(self, share: float = 0.5) -> None:
        if not 0 < float(share) <= 1:
            raise ValueError(f"trainer.warn_failure_share must be in (0, 1], got {share}")
        self.share = float(share)
        self.kinds: set[str] = set()

    def saw(self, rollouts: Sequence[Rollout]) -> None:
        """A finished play: warn about each failure kind seen for the first time."""
        for r in rollouts:
            if r.failure is not None and r.failure.value not in self.kinds:
                self.kinds.add(r.failure.value)
                log.warning("first rollout flagged %s: %s", r.failure.value, r.error[:500] or "no detail")

    def step(self, step: int, seen: Sequence[Rollout]) -> str | None:
        """Warn when this step's flagged share passes the threshold; returns the line (None: under it)."""
        if not seen:
            return None
        flagged = Counter(r.failure.value for r in seen if r.failure is not None)
        share = sum(flagged.values()) / len(seen)
        if share < self.share:
            return None
        kinds = ", ".join(f"{k} {v}" for k, v in flagged.most_common())
        line = (f"step {step}: {sum(flagged.values())} of {len(seen)} rollouts flagged ({share:.0%}: {kinds}); "
                f"trainer.warn_failure_share={self.share:g}")
        log.warning(line)
        return line
