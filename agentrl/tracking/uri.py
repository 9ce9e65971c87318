"""Where the run's metrics go: the tracking URI, resolved without importing MLflow (trainers and the dry run
need it before, or without, a tracker)."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_tracking_uri(tracking_uri: str | None, output_root: str | Path) -> str:
    """logger.tracking_uri, else $MLFLOW_TRACKING_URI, else a SQLite store under the output root."""
    if tracking_uri:
        return tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = Path(output_root)
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root.resolve() / 'mlflow.db'}"
