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
    run_name: str | None = None  # null: the recipe, the job's overrides that differ and the seed
    log_artifacts: bool = True  # the resolved config and the .hydra folder
    # Seconds between a run's heartbeats (one tag write each): a later start judges a silent run by them.
    heartbeat_s: float = 30.0
    # A RUNNING run of another host whose heartbeat is older than this is closed as KILLED at the next start
    # (on this host a run is closed as soon as its process is gone).
    stale_after_s: float = 600.0
    # The share of training plays logged as episode traces (the run's Traces tab); every eval play is traced.
    # Drawn per play from its step, task and position, so a rerun traces the same plays.
    trace_train_fraction: float = 0.02
