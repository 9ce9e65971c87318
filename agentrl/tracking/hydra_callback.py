"""A Hydra callback that gives each multirun one parent MLflow run; jobs become its children.

At the sweep's end the parent holds the best job's objective and params and a table of every job, and the
console gets the same table.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from agentrl.tracking.limits import PARAMS_PER_BATCH
from agentrl.tracking.liveness import Heartbeat, process_tags
from agentrl.tracking.mlflow_tracker import (
    PARENT_RUN_ENV,
    SWEEP_FIXED_KEYS_TAG,
    SWEEP_JOB_TAG,
    experiment_id,
    experiment_name,
    resolve_tracking_uri,
)
from agentrl.tracking.run_names import short_keys
from agentrl.tracking.sweep_summary import OBJECTIVE, best_child, children_of, columns, render, rows


def _parsed(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides)


def fixed_keys(overrides: list[str]) -> list[str]:
    """The keys a sweep's command line sets to one value (no `a,b`, range or choice): the same in every job."""
    return sorted(o.key_or_group for o in _parsed(overrides) if not o.is_sweep_override())


def parent_name(config: DictConfig, overrides: list[str]) -> str:
    """`<task> sweep over <keys>`: the keys its command line sweeps and those its sweeper samples (Optuna's)."""
    swept = [o.key_or_group for o in _parsed(overrides) if o.is_sweep_override()]
    sampled = config.hydra.sweeper.get("params") if "sweeper" in config.hydra else None
    swept += [str(k) for k in (sampled or {}) if k not in swept]
    keys = short_keys(swept)
    return f"{config.task_name} sweep over {', '.join(keys[k] for k in swept)}" if swept else \
        f"{config.task_name} sweep"


def _direction(config: DictConfig) -> str:
    """The sweeper's direction (Optuna's `hydra.sweeper.direction`); maximize when it has none."""
    direction = config.hydra.sweeper.get("direction") if "sweeper" in config.hydra else None
    return "minimize" if str(direction).lower() == "minimize" else "maximize"


class MLflowSweepCallback(Callback):
    """Creates the parent run at the sweep's start; at its end logs the best job and the jobs' table."""

    def __init__(self) -> None:
        self._client: Any = None
        self._parent: str | None = None
        self._heartbeat: Heartbeat | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The joblib launcher pickles the callbacks for its workers: the heartbeat's thread stays in this process.
        return {**self.__dict__, "_heartbeat": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.logger._target_.split(".")[-1] != "MLflowTracker":
            return
        from mlflow.tracking import MlflowClient

        uri = resolve_tracking_uri(config.logger.tracking_uri, config.paths.output_root)
        self._client = MlflowClient(tracking_uri=uri)
        # A sweep of dry runs goes where its jobs go: the dry-run experiment.
        exp = experiment_id(self._client, experiment_name(config.logger, bool(config.get("dry_run"))), uri)
        overrides = list(config.hydra.overrides.task)
        run = self._client.create_run(
            exp,
            run_name=parent_name(config, overrides),
            tags={"agentrl.sweep": "true", "hydra.overrides": " ".join(overrides)[:8000],
                  SWEEP_FIXED_KEYS_TAG: json.dumps(fixed_keys(overrides))[:8000], **process_tags()},
        )
        self._parent = run.info.run_id
        # The parent lives as long as the sweep: its heartbeat keeps a later start from closing it.
        self._heartbeat = Heartbeat(self._client, self._parent, float(config.logger.get("heartbeat_s", 30))).start()
        # The basic launcher runs jobs in this process; other launchers inherit the environment.
        os.environ[PARENT_RUN_ENV] = self._parent

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._parent is None:
            return
        if self._heartbeat is not None:
            self._heartbeat.stop()
        client, parent = self._client, self._parent
        runs = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent}'")
        children = children_of(runs, SWEEP_JOB_TAG)
        direction = _direction(config)
        best = best_child(children, direction)
        if best is not None:
            self._log_best(best)
        table = rows(children)
        with warnings.catch_warnings():  # pandas deprecations inside MLflow's own table code: nothing to act on
            warnings.simplefilter("ignore")
            client.log_table(parent, data={col: [r[i] for r in table] for i, col in enumerate(columns())},
                             artifact_file="sweep_jobs.json")
        summary = render(children, best, direction)
        client.log_text(parent, summary + "\n", "sweep_jobs.txt")
        client.set_tag(parent, "agentrl.sweep.jobs", str(len(children)))
        client.set_terminated(parent)
        print(f"{summary}\nsweep's MLflow run {parent}", flush=True)
        os.environ.pop(PARENT_RUN_ENV, None)
        self._parent = None

    def _log_best(self, best: Any) -> None:
        """The best job's objective as the parent's metric, its params as the parent's params, its run as tags."""
        from mlflow.entities import Param

        client, parent = self._client, self._parent
        client.log_metric(parent, f"best/{OBJECTIVE}", best.objective)
        client.set_tag(parent, "agentrl.sweep.best_run_id", best.run_id)
        client.set_tag(parent, "agentrl.sweep.best_run_name", best.name)
        params = [Param(k, v) for k, v in client.get_run(best.run_id).data.params.items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            client.log_batch(parent, params=params[i : i + PARAMS_PER_BATCH])
