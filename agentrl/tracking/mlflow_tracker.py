"""MLflow behind the Tracker interface: one run per Hydra job, child runs under a sweep's parent."""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# Environment variable through which a multirun's parent run reaches its jobs (basic launcher: same process).
PARENT_RUN_ENV = "AGENTRL_MLFLOW_PARENT_RUN_ID"
# MLflow's log-batch REST limits.
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
_PARAM_VALUE_CHARS = 6000
_TAG_VALUE_CHARS = 8000


def resolve_tracking_uri(tracking_uri: str | None, output_root: str | Path) -> str:
    """logger.tracking_uri, else $MLFLOW_TRACKING_URI, else a SQLite store under the output root."""
    if tracking_uri:
        return tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = Path(output_root)
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root.resolve() / 'mlflow.db'}"


def flatten_params(node: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a resolved config into `a/b/c` keys; lists become `a/0`, `a/1`; values truncated to MLflow's limit."""
    out: dict[str, str] = {}
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = ((str(i), v) for i, v in enumerate(node))
    else:
        value = str(node)
        return {prefix: value[:_PARAM_VALUE_CHARS]}
    for key, value in items:
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, (dict, list)) and value:
            out.update(flatten_params(value, name))
        else:
            out[name] = str(value)[:_PARAM_VALUE_CHARS]
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


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment `name`, created if missing (safe against a concurrent creator)."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        return client.get_experiment_by_name(name).experiment_id


class MLflowTracker:
    """One MLflow run. Trainers call `log`; `run.py` calls `start` and `finish`."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "agentrl",
        run_name: str | None = None,
        log_artifacts: bool = True,
        output_root: str | Path = "outputs",
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = resolve_tracking_uri(tracking_uri, output_root)
        self.experiment = experiment
        self.run_name = run_name
        self.log_artifacts_enabled = log_artifacts
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id: str | None = None
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
    ) -> str:
        """Open (or reopen, on resume) the run; log params, tags and config artifacts once."""
        if resume_run_id:
            self.run_id = resume_run_id
            self.client.update_run(resume_run_id, status="RUNNING")
            for key in self.client.get_run(resume_run_id).data.metrics:
                steps = [m.step for m in self.client.get_metric_history(resume_run_id, key)]
                self._logged_upto[key] = max(steps, default=-1)
            return resume_run_id
        tags: dict[str, str] = {f"choice.{g}": str(o) for g, o in sorted(choices.items()) if o is not None}
        tags["hydra.overrides"] = " ".join(overrides or [])[:_TAG_VALUE_CHARS]
        tags["agentrl.run_dir"] = str(run_dir)
        tags["agentrl.dry_run"] = str(bool(cfg.dry_run)).lower()
        commit = git_commit()
        if commit:
            tags["mlflow.source.git.commit"] = commit
        parent = os.environ.get(PARENT_RUN_ENV)
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(
            experiment_id(self.client, self.experiment), run_name=self.run_name, tags=tags
        )
        self.run_id = run.info.run_id
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

    def _log_params(self, container: Any) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten_params(container).items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + _PARAMS_PER_BATCH])

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log finite scalar metrics at `step`; non-finite values and steps a resumed run already logged are skipped."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(key, float(value), now, int(step))
            for key, value in metrics.items()
            if value is not None and math.isfinite(float(value)) and step > self._logged_upto.get(key, -1)
        ]
        for i in range(0, len(batch), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + _METRICS_PER_BATCH])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or a folder's contents."""
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value)[:_TAG_VALUE_CHARS])

    def finish(self, status: str = "FINISHED") -> None:
        """Close the run (FINISHED, FAILED or KILLED)."""
        if self.run_id:
            self.client.set_terminated(self.run_id, status=status)
