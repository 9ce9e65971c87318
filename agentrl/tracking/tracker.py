"""The interface trainers log through."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    """What a trainer sees of experiment tracking."""

    run_id: str | None

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log scalar metrics at `step`."""

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or folder."""

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Attach tags to the run."""


class NullTracker:
    """Logs nothing; records what it was given (for tests and dry runs)."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.artifacts: list[tuple[str, str | None]] = []
        self.tags: dict[str, Any] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.artifacts.append((str(path), artifact_path))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.tags.update(tags)
