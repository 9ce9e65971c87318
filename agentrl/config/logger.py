"""Schemas of the `logger` group: where metrics go."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoggerConfig:
    _target_: str = "agentrl.tracking.mlflow_tracker.MLflowTracker"


@dataclass
class MLflowLoggerConfig(LoggerConfig):
    # null: $MLFLOW_TRACKING_URI if set, else SQLite under the output root.
    tracking_uri: str | None = None
    experiment: str = "agentrl"
    # Where dry runs (dry_run=true) log, so the experiment above lists real runs only; null: the same experiment.
    dry_run_experiment: str | None = "${.experiment}-dry-runs"
    run_name: str | None = None  # null: the recipe and the job's overrides
    log_artifacts: bool = True  # the resolved config and the .hydra folder
