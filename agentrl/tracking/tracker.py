"""The interface trainers log through."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    """What a trainer sees of experiment tracking."""

    run_id: str | None
    tracking_uri: str
    experiment: str

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log scalar metrics at `step`."""

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or folder."""

    def latest_metrics(self) -> dict[str, float]:
        """The last logged value of every metric of the run (including what another process logged there)."""

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Attach tags to the run."""

    def log_model(self, model_dir: str | Path, name: str = "model") -> str | None:
        """Log a saved Hugging Face model folder as the run's logged model; its id, or None if it was skipped."""
