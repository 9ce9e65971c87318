"""MLflowTracker against MLflow's real SQLite store."""

from __future__ import annotations

import math
from pathlib import Path

from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from agentrl.tracking.mlflow_tracker import MLflowTracker, flatten_params


def _cfg():
    return OmegaConf.create({"dry_run": False, "trainer": {"lr": 1e-5, "roles": [{"name": "a"}, {"name": "b"}]},
                             "note": "x" * 7000})


def test_params_tags_metrics_and_resume_without_duplicates(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    run_id = tracker.start(_cfg(), choices={"trainer": "grpo", "env": None}, run_dir=tmp_path / "run",
                           overrides=["trainer.lr=1e-5"])
    for step in range(4):
        tracker.log({"train/reward": step / 10, "bad": math.nan}, step=step)
    tracker.finish("KILLED")

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.params["trainer/lr"] == "1e-05"
    assert run.data.params["trainer/roles/1/name"] == "b"
    assert len(run.data.params["note"]) == 6000  # truncated to MLflow's limit, not refused
    assert run.data.tags["choice.trainer"] == "grpo" and "choice.env" not in run.data.tags
    assert "bad" not in run.data.metrics  # non-finite values are dropped
    assert (tmp_path / "run" / "config_resolved.yaml").is_file()

    # A resumed run replays steps 2 and 3 (logged after its last checkpoint) and goes on to 4.
    resumed = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    assert resumed.start(_cfg(), choices={}, run_dir=tmp_path / "run", resume_run_id=run_id) == run_id
    for step in (2, 3, 4):
        resumed.log({"train/reward": 0.9}, step=step)
    resumed.finish()
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/reward"))
    assert history == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9)]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_flatten_params_nested_and_empty():
    flat = flatten_params({"a": {"b": 1, "c": [3, {"d": None}]}, "e": [], "f": {}})
    assert flat == {"a/b": "1", "a/c/0": "3", "a/c/1/d": "None", "e": "[]", "f": "{}"}
