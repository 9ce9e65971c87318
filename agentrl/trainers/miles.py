"""Placeholder until this trainer lands."""

from __future__ import annotations

from typing import Any


class MilesTrainer:
    """Not yet available: dry runs work, training reports so."""

    def __init__(self, cfg: Any, *, plan: Any, tracker: Any) -> None:
        self.cfg, self.plan, self.tracker = cfg, plan, tracker

    def fit(self) -> dict[str, float]:
        raise NotImplementedError("trainer 'miles' is not yet available in this version of agentrl; use dry_run=true")
