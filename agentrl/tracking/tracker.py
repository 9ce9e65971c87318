"""The interface trainers, `run.py` and the plan track a run through (MLflow is one implementation)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentrl.config.locate import HOME_ENV


@dataclass(frozen=True)
class DatasetRef:
    """One split of an env bundle as a dataset input of the run (MLflow: the run page's "Datasets")."""

    name: str  # e.g. gridsim
    context: str  # the role the run gives it: train or eval
    split: str
    rows: int
    version: str = ""
    source: str = ""  # where its rows live (a file or folder), for the UI's "source"
    options: tuple[tuple[str, Any], ...] = ()  # options that change the data (prompt style, ...)

    def digest(self) -> str:
        """A short content key: same bundle, version, split, size and data options give the same digest."""
        key = json.dumps([self.name, self.version, self.split, self.rows, list(self.options)], default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:10]


class Tracker(Protocol):
    """Everything the code outside `agentrl.tracking` does with a run's tracking: trainers log; `run.py` opens,
    describes and closes the run."""

    run_id: str | None
    tracking_uri: str
    experiment: str
    task_name: str  # the job's task_name, set by start()
    dead_runs: list[Any]  # earlier runs of the experiment that start() found dead and closed (liveness.DeadRun)
    trace_train_fraction: float  # the share of training plays logged as episode traces (every eval play is)

    def start(self, cfg: Any, *, choices: dict[str, str | None], run_dir: Path, overrides: list[str] | None = None,
              resume_run_id: str | None = None, sweep_job: int | None = None) -> str:
        """Open the run (or reopen `resume_run_id`); returns its id."""

    def finish(self, status: str = "FINISHED") -> None:
        """Close the run as FINISHED, FAILED or KILLED."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log scalar metrics at `step`."""

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or folder."""

    def log_table(self, rows: list[dict[str, Any]], name: str) -> None:
        """Log a table (one dict per row, the same keys in each) as artifact `name` (e.g. an eval's samples)."""

    def log_traces(self, traces: list[Any]) -> None:
        """Queue episode traces (`agentrl.tracking.traces.EpisodeTrace`): written off the caller's thread, every
        one of them by `finish()`."""

    def log_datasets(self, datasets: list[DatasetRef]) -> None:
        """Record the splits the run trains and evaluates on as its dataset inputs."""

    def latest_metrics(self) -> dict[str, float]:
        """The last logged value of every metric of the run (including what another process logged there)."""

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Attach tags to the run."""

    def log_model(self, model_dir: str | Path, name: str = "model") -> str | None:
        """Log a saved Hugging Face model folder as the run's logged model; its id, or None if it was skipped."""

    def url(self, charts: bool = False) -> str | None:
        """The run's page in the tracking UI (None before start); `charts`: opened on its metric charts."""

    def ui_command(self) -> str:
        """How a user browses this store (a command, or the server's address)."""

    def reopen_problem(self, run_id: str) -> str | None:
        """Why run `run_id` cannot be reopened in this store (None: it can)."""

    def dead_run_notes(self, *, resumable: bool) -> list[str]:
        """The closing block's lines about earlier runs of this task that start() found dead."""


def continue_line(overrides: list[str], run_id: str, *, resumable: bool, why: str = "") -> str:
    """The closing block's line on how to go on with a stopped run: its own command line (`overrides`), its resume
    setting replaced by `trainer.resume=<run id>` (its newest checkpoint, docs/training.md), or run again as it
    was when it cannot resume (`why` says why; default: the trainer cannot)."""
    # Quoted for a shell: an override with a space or a quote in it pastes back as the one argument it was.
    args = [o for o in overrides if not o.lstrip("+").startswith("trainer.resume")]
    command = f"{home_prefix()}python -m agentrl"
    if resumable:
        return f"resume it     {command} {shlex.join(args + [f'trainer.resume={run_id}'])}"
    return f"rerun it      {command} {shlex.join(args)}  ({why or 'this trainer does not resume'})"


def home_prefix() -> str:
    """`AGENTRL_HOME=<its absolute path> ` when the variable is set: the project root (its checkpoints and MLflow
    store) a printed command must run in to find this run from any other shell; "" when it is not set."""
    home = os.environ.get(HOME_ENV)
    return f"{HOME_ENV}={shlex.quote(str(Path(home).expanduser().resolve()))} " if home else ""
