"""MLflow behind the Tracker interface: one run per Hydra job, child runs under a sweep's parent."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from omegaconf import DictConfig, OmegaConf

from agentrl.config.logger import MLflowLoggerConfig
from agentrl.interrupts import HeldCalls
from agentrl.tracking.adapter_model import is_adapter, log_adapter
from agentrl.tracking.hf_model import log_hf_model
from agentrl.tracking.limits import METRICS_PER_BATCH, PARAM_VALUE_CHARS, PARAMS_PER_BATCH, TAG_VALUE_CHARS
from agentrl.tracking.liveness import (
    FOUND_DEAD_TAG,
    DeadRun,
    Heartbeat,
    dead_run_note,
    mark_dead_runs,
    process_tags,
)
from agentrl.tracking.run_names import run_name as make_run_name
from agentrl.tracking.trace_record import EpisodeTrace
from agentrl.tracking.traces import TraceWriter
from agentrl.tracking.tracker import DatasetRef
from agentrl.tracking.uri import resolve_tracking_uri

# Environment variable through which a multirun's parent run reaches its jobs (basic launcher: same process).
PARENT_RUN_ENV = "AGENTRL_MLFLOW_PARENT_RUN_ID"
# The parent run's tag listing (JSON) the override keys a sweep fixes for all its jobs: their names leave them out.
SWEEP_FIXED_KEYS_TAG = "agentrl.sweep.fixed_keys"
SWEEP_JOB_TAG = "agentrl.sweep.job"  # a job's number in its sweep
# MLflow 3's UI shows an experiment without this tag in GenAI mode ("Evaluations", traces); this value declares a
# classic training experiment, so the UI opens on runs, metrics and charts. (Values the UI knows:
# custom_model_development, genai_development, finetuning, regression, classification, forecasting.)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# The UI's own switch to its "Model training" view (MLflow 3.17 reads it from the URL; the tag above it ignores).
UI_TRAINING_VIEW = "workflowType=machine_learning"
# The run description MLflow's UI shows on the run page.
DESCRIPTION_TAG = "mlflow.note.content"
# The run page's tab of metric charts (MLflow 3.17's route): the link a training run prints opens on it.
METRICS_TAB = "model-metrics"
# That tab draws one chart per metric, in sections named by the key's prefix (`eval/grade` -> `eval`), sorted by
# name (the browser remembers a reordering; nothing on the server orders them), charts by key within a section.
# So `async/*` came first. Each key here is also logged as `_summary/<key with _ for />` (`_summary/eval_grade`),
# the same value at the same step: `_` sorts before every lowercase prefix (by code unit and by locale), so these
# six charts, two rows of three, are the tab's first screen; the rest keep their sections after them.
SUMMARY_SECTION = "_summary"
SUMMARY_KEYS = ("eval/grade", "eval_greedy/grade", "eval/reward", "train/reward", "train/loss", "time/step_s")

log = logging.getLogger(__name__)


def flatten_params(node: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a resolved config into `a/b/c` keys; lists become `a/0`, `a/1`; values truncated to MLflow's limit."""
    out: dict[str, str] = {}
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = ((str(i), v) for i, v in enumerate(node))
    else:
        value = str(node)
        return {prefix: value[:PARAM_VALUE_CHARS]}
    for key, value in items:
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, (dict, list)) and value:
            out.update(flatten_params(value, name))
        else:
            out[name] = str(value)[:PARAM_VALUE_CHARS]
    return out


def git_commit(cwd: Path | None = None) -> str | None:
    """The checkout's commit (with `-dirty`), or None outside a git checkout."""
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def artifact_root(tracking_uri: str) -> str | None:
    """Where a new experiment's artifacts go: beside a local SQLite store (`<store folder>/mlartifacts`).

    MLflow's own default is `./mlruns` under the current directory, so artifacts would land wherever the user
    stands. A tracking server (http...) and other stores keep their own default (None).
    """
    parsed = urlparse(tracking_uri)
    if parsed.scheme != "sqlite" or not parsed.path or parsed.path in ("/", "/:memory:"):
        return None
    db = Path(unquote(parsed.path[1:]))  # sqlite:///rel.db is relative, sqlite:////abs.db absolute
    return (db.parent / "mlartifacts").resolve().as_uri()


def experiment_id(client: Any, name: str, tracking_uri: str | None = None) -> str:
    """The id of experiment `name`, created if missing (safe against a concurrent creator).

    A new experiment keeps its artifacts beside a local store and is declared a training experiment; an
    existing one is declared too (its artifact location, fixed at creation, stays).
    """
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        uri = tracking_uri or client.tracking_uri
        try:
            return client.create_experiment(name, artifact_location=artifact_root(uri),
                                             tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException:
            exp = client.get_experiment_by_name(name)
    if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def experiment_name(logger_cfg: Any, dry_run: bool) -> str:
    """The experiment a job logs to: `logger.experiment`, or `logger.dry_run_experiment` for a dry run."""
    if dry_run and logger_cfg.get("dry_run_experiment"):
        return str(logger_cfg.dry_run_experiment)
    return str(logger_cfg.experiment)


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The copies of `metrics`' `SUMMARY_KEYS` under `SUMMARY_SECTION` (`eval/grade` -> `_summary/eval_grade`)."""
    return {f"{SUMMARY_SECTION}/{key.replace('/', '_')}": metrics[key] for key in SUMMARY_KEYS if key in metrics}


def ui_command(tracking_uri: str) -> str:
    """The command that browses this store: `mlflow ui` for a local one; a server is already browsable."""
    if urlparse(tracking_uri).scheme in ("http", "https"):
        return f"open {tracking_uri} in a browser"
    return f"mlflow ui --backend-store-uri {tracking_uri}"


class MLflowTracker:
    """One MLflow run. Trainers call `log`; `run.py` calls `start` and `finish`."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "agentrl",
        run_name: str | None = None,
        log_artifacts: bool = True,
        output_root: str | Path = "outputs",
        dry_run_experiment: str | None = None,
        heartbeat_s: float = 30.0,
        stale_after_s: float = 600.0,
        trace_train_fraction: float = MLflowLoggerConfig.trace_train_fraction,
    ) -> None:
        from mlflow.tracking import MlflowClient

        for key, value in (("heartbeat_s", heartbeat_s), ("stale_after_s", stale_after_s)):
            if not float(value) > 0:
                raise ValueError(f"logger.{key} must be > 0 seconds, got {value}")
        if not 0.0 <= float(trace_train_fraction) <= 1.0:
            raise ValueError(f"logger.trace_train_fraction must be in [0, 1], got {trace_train_fraction}")
        self.trace_train_fraction = float(trace_train_fraction)
        self._traces: TraceWriter | None = None  # started by the first log_traces
        self._traces_lock = threading.Lock()

        self.tracking_uri = resolve_tracking_uri(tracking_uri, output_root)
        self.experiment = experiment
        # A dry run logs here instead, so the experiment holds real runs only (None: the same experiment).
        self.dry_run_experiment = dry_run_experiment
        self.experiment_id: str | None = None
        self.run_name = run_name
        self.log_artifacts_enabled = log_artifacts
        # Ctrl-C and SIGTERM wait for a call to the store to end: one raised inside SQLAlchemy can leave SQLite
        # locked for every later write, the run's own KILLED among them (agentrl/interrupts.py).
        self.client = HeldCalls(MlflowClient(tracking_uri=self.tracking_uri))
        self.run_id: str | None = None
        self.heartbeat_s, self.stale_after_s = float(heartbeat_s), float(stale_after_s)
        self._heartbeat: Heartbeat | None = None
        self.task_name = ""
        # RUNNING runs of the experiment that this start found without a live process and closed as KILLED.
        self.dead_runs: list[DeadRun] = []
        # On resume: the last step already logged per metric. A killed run may have logged steps past its
        # last checkpoint; the resumed run replays those steps and must not log them twice.
        self._logged_upto: dict[str, int] = {}

    def start(
        self,
        cfg: DictConfig,
        *,
        choices: dict[str, str | None],
        run_dir: Path,
        overrides: list[str] | None = None,
        resume_run_id: str | None = None,
        sweep_job: int | None = None,
    ) -> str:
        """Open (or reopen, on resume) the run; log params, tags, description and config artifacts once.

        A dry run goes to `dry_run_experiment` (when set), never to the experiment real runs are compared in.
        `sweep_job`: the job's number in its multirun (None outside one), which keeps the jobs' names apart.
        Every start then closes the experiment's RUNNING runs whose process is gone (`dead_runs`).
        """
        if cfg.get("dry_run") and self.dry_run_experiment:
            self.experiment = self.dry_run_experiment
        self.task_name = str(cfg.get("task_name") or "")
        if resume_run_id:
            self.run_id = resume_run_id
            self.experiment_id = self.client.get_run(resume_run_id).info.experiment_id
            self.client.update_run(resume_run_id, status="RUNNING")
            self.set_tags(process_tags())  # this process now: the old one's pid would read as dead
            if FOUND_DEAD_TAG in self.client.get_run(resume_run_id).data.tags:  # it lives again
                self.client.delete_tag(resume_run_id, FOUND_DEAD_TAG)
            for key in self.client.get_run(resume_run_id).data.metrics:
                steps = [m.step for m in self.client.get_metric_history(resume_run_id, key)]
                self._logged_upto[key] = max(steps, default=-1)
            self._watch()
            return resume_run_id
        parent = os.environ.get(PARENT_RUN_ENV)
        tags: dict[str, str] = {f"choice.{g}": str(o) for g, o in sorted(choices.items()) if o is not None}
        tags.update(process_tags())
        tags["hydra.overrides"] = " ".join(overrides or [])[:TAG_VALUE_CHARS]
        tags["agentrl.run_dir"] = str(run_dir)
        tags["agentrl.dry_run"] = str(bool(cfg.dry_run)).lower()
        commit = git_commit()
        if commit:
            tags["mlflow.source.git.commit"] = commit
        if cfg.get("description"):
            tags[DESCRIPTION_TAG] = str(cfg.description)[:TAG_VALUE_CHARS]
        if parent:
            tags["mlflow.parentRunId"] = parent
        if sweep_job is not None:
            tags[SWEEP_JOB_TAG] = str(sweep_job)
        self.experiment_id = experiment_id(self.client, self.experiment, self.tracking_uri)
        run = self.client.create_run(self.experiment_id, run_name=self._name(cfg, choices, overrides, parent,
                                                                              sweep_job), tags=tags)
        self.run_id = run.info.run_id
        self._watch()
        self._log_params(OmegaConf.to_container(cfg, resolve=True))
        if self.log_artifacts_enabled:
            resolved = run_dir / "config_resolved.yaml"
            resolved.parent.mkdir(parents=True, exist_ok=True)
            resolved.write_text(OmegaConf.to_yaml(cfg, resolve=True))
            self.log_artifact(resolved)
            hydra_dir = run_dir / ".hydra"
            if hydra_dir.is_dir():
                self.log_artifact(hydra_dir, "hydra")
        return self.run_id

    def _name(self, cfg: DictConfig, choices: dict[str, str | None], overrides: list[str] | None,
              parent: str | None, sweep_job: int | None) -> str:
        """`logger.run_name`, else the recipe, the job's overrides that differ and the seed; `#N` in a sweep."""
        if self.run_name:
            return self.run_name if sweep_job is None else f"{self.run_name} #{sweep_job}"
        fixed: list[str] = []
        if parent:
            fixed = json.loads(self.client.get_run(parent).data.tags.get(SWEEP_FIXED_KEYS_TAG, "[]"))
        recipe = choices.get("recipe") or str(cfg.get("task_name") or "run")
        return make_run_name(recipe, overrides or [], cfg.get("seed"), fixed_keys=fixed, job=sweep_job)

    def _watch(self) -> None:
        """Close the experiment's runs that died RUNNING, then keep this run's heartbeat going."""
        self.dead_runs = mark_dead_runs(self.client, self.experiment_id, stale_after_s=self.stale_after_s,
                                        found_by=self.run_id, skip=frozenset({self.run_id}))
        self._heartbeat = Heartbeat(self.client, self.run_id, self.heartbeat_s).start()

    def _log_params(self, container: Any) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten_params(container).items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_BATCH])

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log finite scalar metrics at `step`, and the headline ones' copies (`summary_metrics`); non-finite values
        and steps a resumed run already logged are skipped."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(key, float(value), now, int(step))
            for key, value in {**metrics, **summary_metrics(metrics)}.items()
            if value is not None and math.isfinite(float(value)) and step > self._logged_upto.get(key, -1)
        ]
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + METRICS_PER_BATCH])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or a folder's contents."""
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_table(self, rows: list[dict[str, Any]], name: str) -> None:
        """A table (MLflow's log_table: the run's Evaluation/Artifacts view) at artifact `name` (a .json file)."""
        if rows:
            self.client.log_table(self.run_id, {key: [row.get(key) for row in rows] for key in rows[0]}, name)

    def log_traces(self, traces: list[EpisodeTrace]) -> None:
        """Queue episode traces for this run (`TraceWriter`: off the caller's thread; `finish()` writes the rest)."""
        with self._traces_lock:  # plays finish on the play-ahead thread and the caller's at once
            if self._traces is None:
                self._traces = TraceWriter(self.tracking_uri, str(self.experiment_id), self.run_id)
            for trace in traces:
                self._traces.put(trace)

    def _close_traces(self) -> None:
        with self._traces_lock:
            if self._traces is not None:
                self._traces.close()
                self._traces = None

    def latest_metrics(self) -> dict[str, float]:
        """The last logged value of every metric of this run (another process may have logged them)."""
        return {k: float(v) for k, v in self.client.get_run(self.run_id).data.metrics.items()}

    def set_tags(self, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value)[:TAG_VALUE_CHARS])

    def log_datasets(self, datasets: list[DatasetRef]) -> None:
        """Record the env splits the run trains and evaluates on as its dataset inputs (context tag: the role)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = [
            DatasetInput(
                Dataset(name=d.name, digest=d.digest(), source_type="local",
                        source=json.dumps({"uri": d.source, "split": d.split, "version": d.version}),
                        profile=json.dumps({"num_rows": d.rows, "split": d.split, **dict(d.options)}, default=str)),
                tags=[InputTag("mlflow.data.context", d.context)],
            )
            for d in datasets
        ]
        if inputs:
            self.client.log_inputs(self.run_id, datasets=inputs)

    def log_model(self, model_dir: str | Path, name: str = "model") -> str | None:
        """Log a saved Hugging Face folder (weights, config, tokenizer) as this run's model, transformers flavor.

        The model appears under the run's "Logged models" and in its experiment, its files beside the run's
        artifacts. Returns the logged model's id. A missing optional dependency of MLflow's transformers flavor,
        or a folder it cannot read, warns and returns None: a run must not fail at its very end over this.
        """
        if self.run_id is None or self.experiment_id is None:
            raise RuntimeError("log_model before start()")
        self._close_traces()  # the trace writer also points MLflow's process-wide URI at this store meanwhile
        model_dir = Path(model_dir)
        if is_adapter(model_dir):  # a LoRA run's: the adapter and its base's folder, not a copy of the base
            return log_adapter(self.client, self.experiment_id, self.run_id, model_dir, name)
        return log_hf_model(self.client, self.tracking_uri, self.experiment_id, self.run_id, model_dir, name)

    def url(self, charts: bool = False) -> str | None:
        """The run page in the MLflow UI (the default `mlflow ui` address for a local store), training view;
        `charts`: opened on its metric charts (`METRICS_TAB`, the summary section first), else its overview.

        MLflow 3.17's UI picks GenAI or "Model training" from its `workflowType` URL parameter (else the toggle
        the browser remembers, GenAI at first) and not from the experiment's kind tag, so the link names it.
        """
        if self.run_id is None or self.experiment_id is None:
            return None
        base = self.tracking_uri if urlparse(self.tracking_uri).scheme in ("http", "https") else "http://127.0.0.1:5000"
        tab = f"/{METRICS_TAB}" if charts else ""
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}{tab}?{UI_TRAINING_VIEW}"

    def ui_command(self) -> str:
        """The command that browses this store (`ui_command` of its URI)."""
        return ui_command(self.tracking_uri)

    def reopen_problem(self, run_id: str) -> str | None:
        """Why this store cannot reopen run `run_id` (the error's type), None when it can."""
        try:
            self.client.get_run(run_id)
        except Exception as err:  # noqa: BLE001 - MLflow's not-found error; any failure here means: not reopenable
            return type(err).__name__
        return None

    def dead_run_notes(self, *, resumable: bool) -> list[str]:
        """The closing block's lines about the runs of this task that start() found dead."""
        return [line for dead in self.dead_runs if dead.task == self.task_name
                for line in dead_run_note(dead, resumable=resumable)]

    def finish(self, status: str = "FINISHED") -> None:
        """Close the run (FINISHED, FAILED or KILLED)."""
        self._close_traces()
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self.run_id:
            self.client.set_terminated(self.run_id, status=status)
