"""A Hydra callback that gives each multirun one parent MLflow run; jobs become its children."""

from __future__ import annotations

import os
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from agentrl.tracking.mlflow_tracker import (
    PARENT_RUN_ENV,
    experiment_id,
    experiment_name,
    resolve_tracking_uri,
)


class MLflowSweepCallback(Callback):
    """Creates the parent run at the sweep's start, ends it with the best objective at its end."""

    def __init__(self) -> None:
        self._client: Any = None
        self._parent: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.logger._target_.split(".")[-1] != "MLflowTracker":
            return
        from mlflow.tracking import MlflowClient

        uri = resolve_tracking_uri(config.logger.tracking_uri, config.paths.output_root)
        self._client = MlflowClient(tracking_uri=uri)
        # A sweep of dry runs goes where its jobs go: the dry-run experiment.
        exp = experiment_id(self._client, experiment_name(config.logger, bool(config.get("dry_run"))), uri)
        overrides = " ".join(config.hydra.overrides.task)
        run = self._client.create_run(
            exp,
            run_name=f"sweep-{config.task_name}",
            tags={"agentrl.sweep": "true", "hydra.overrides": overrides[:8000]},
        )
        self._parent = run.info.run_id
        # The basic launcher runs jobs in this process; other launchers inherit the environment.
        os.environ[PARENT_RUN_ENV] = self._parent

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._parent is None:
            return
        children = self._client.search_runs(
            [self._client.get_run(self._parent).info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self._parent}'",
        )
        scores = [r.data.metrics["eval/reward"] for r in children if "eval/reward" in r.data.metrics]
        if scores:
            self._client.log_metric(self._parent, "best/eval/reward", max(scores))
        self._client.set_tag(self._parent, "agentrl.sweep.jobs", str(len(children)))
        self._client.set_terminated(self._parent)
        os.environ.pop(PARENT_RUN_ENV, None)
        self._parent = None
