"""MLflowTracker against MLflow's real SQLite store."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from mlflow.entities import LoggedModelStatus
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from agentrl.play.eval_results import table_rows
from agentrl.run import closing_block
from agentrl.testing.mlflow_store import seed_store
from agentrl.tracking.mlflow_tracker import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    MLflowTracker,
    artifact_root,
    flatten_params,
)
from agentrl.tracking.tracker import DatasetRef


def _cfg():
    return OmegaConf.create({"dry_run": False, "trainer": {"lr": 1e-5, "roles": [{"name": "a"}, {"name": "b"}]},
                             "note": "x" * 7000})


def test_params_tags_metrics_and_resume_without_duplicates(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
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


def test_headline_metrics_are_copied_into_the_summary_section_that_sorts_first(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    run_id = tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    tracker.log({"eval/grade": 0.25, "eval/reward": 0.5, "eval/zero_share": 0.5}, step=0)
    for step in (1, 2):
        tracker.log({"train/reward": step / 10, "train/loss": -step, "time/step_s": 3.0 + step,
                     "async/held_s": 0.0, "train/kl": 0.1}, step=step)
    tracker.log({"eval/grade": 0.75, "eval/reward": 0.5}, step=2)
    tracker.log({"eval_greedy/grade": 0.8, "eval_greedy/reward": 0.8}, step=2)
    tracker.finish()

    client = MlflowClient(uri)
    copies = {"_summary/eval_grade": "eval/grade", "_summary/eval_greedy_grade": "eval_greedy/grade",
              "_summary/eval_reward": "eval/reward", "_summary/train_reward": "train/reward",
              "_summary/train_loss": "train/loss", "_summary/time_step_s": "time/step_s"}
    assert {key for key in client.get_run(run_id).data.metrics if key.startswith("_summary/")} == set(copies)

    def history(name: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))

    for key, source in copies.items():  # the same values at the same steps as the metric each copies
        assert history(key) == history(source) != [], key
    # Sections are sorted by name, by code unit on the first draw and by locale after it: the summary's prefix
    # comes before every other agentrl prefix under both (`_` is punctuation, before letters, to ICU too).
    prefixes = {key.split("/")[0] for key in client.get_run(run_id).data.metrics}
    assert sorted(prefixes)[0] == "_summary"
    assert "_summary" < "async" and "_summary" < "best" and "_summary" < "eval"


def test_the_link_a_training_run_prints_opens_its_charts(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    page = f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/{tracker.run_id}"
    assert tracker.url() == f"{page}?workflowType=machine_learning"
    assert tracker.url(charts=True) == f"{page}/model-metrics?workflowType=machine_learning"
    tracker.finish()


def test_the_eval_table_leads_with_its_numbers():
    record = {"task_id": "t1", "split": "eval", "prompt": "p" * 500,
              "samples": [{"score": 0.5, "grade": 0.4, "reward": 0.5, "answer": "a" * 500, "tool_calls": 1,
                           "invalid_calls": 0, "completion_tokens": 9, "failure": None}]}
    [row] = table_rows([record])
    # MLflow's artifact view draws the columns in this order: the grade, score and reward within the first
    # screen, the long prompt and completion last.
    assert list(row)[:4] == ["task_id", "grade", "score", "reward"]
    assert list(row)[-2:] == ["prompt", "completion"]
    assert (row["grade"], row["score"], row["reward"]) == (0.4, 0.5, 0.5)


def test_flatten_params_nested_and_empty():
    flat = flatten_params({"a": {"b": 1, "c": [3, {"d": None}]}, "e": [], "f": {}})
    assert flat == {"a/b": "1", "a/c/0": "3", "a/c/1/d": "None", "e": "[]", "f": "{}"}


def test_experiment_is_a_training_one_with_artifacts_beside_the_store(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's own default would put artifacts in ./mlruns here
    store = tmp_path / "outputs" / "mlflow.db"
    uri = f"sqlite:///{store}"
    # An experiment made before agentrl declared its kind gets the tag too.
    client = MlflowClient(uri)
    old = client.create_experiment("old")
    for name in ("t", "old"):
        tracker = MLflowTracker(tracking_uri=uri, experiment=name, output_root=tmp_path / "outputs")
        run_id = tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
        tracker.finish()
        exp = client.get_experiment(tracker.experiment_id)
        assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    new = client.get_experiment_by_name("t")
    assert new.artifact_location == (tmp_path / "outputs" / "mlartifacts").as_uri()
    assert client.get_run(run_id).info.experiment_id == old
    assert artifact_root("http://127.0.0.1:5000") is None  # a server keeps its own artifact store


def test_dry_run_goes_to_its_own_experiment(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
    cfg = OmegaConf.create({"dry_run": True, "description": "What this run is for."})
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", dry_run_experiment="t-dry-runs", output_root=tmp_path)
    run_id = tracker.start(cfg, choices={}, run_dir=tmp_path / "run")
    tracker.finish()
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("t") is None
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "t-dry-runs"
    assert run.data.tags["mlflow.note.content"] == "What this run is for."
    # Without a dry-run experiment, dry runs share the experiment (logger.dry_run_experiment=null).
    shared = MLflowTracker(tracking_uri=uri, experiment="t", dry_run_experiment=None, output_root=tmp_path)
    shared.start(cfg, choices={}, run_dir=tmp_path / "run")
    assert client.get_experiment(client.get_run(shared.run_id).info.experiment_id).name == "t"


def test_datasets_are_the_runs_inputs(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    train = DatasetRef("gridsim", "train", "train", 2000, "3", "/b/gridsim", (("prompt_style", "compact"),))
    evals = DatasetRef("gridsim", "eval", "eval", 200, "3", "/b/gridsim", (("prompt_style", "compact"),))
    tracker.log_datasets([train, evals])
    tracker.finish()
    inputs = MlflowClient(uri).get_run(tracker.run_id).inputs.dataset_inputs
    by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset for i in inputs}
    assert set(by_context) == {"train", "eval"}
    assert by_context["train"].name == "gridsim" and by_context["train"].digest == train.digest()
    assert json.loads(by_context["eval"].profile)["num_rows"] == 200
    assert train.digest() != evals.digest()
    assert DatasetRef("gridsim", "train", "train", 2000, "3", "/b", (("prompt_style", "full"),)).digest() != train.digest()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.testing.tiny_models import shared_tiny_model

    return Path(shared_tiny_model(seed=0))  # read only: built once per session


@pytest.mark.slow
def test_log_model_is_a_transformers_logged_model_of_the_run(tmp_path: Path, tiny_model: Path):
    uri = seed_store(tmp_path / "outputs" / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path / "outputs")
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    model_id = tracker.log_model(tiny_model, name="model")
    tracker.finish()
    assert model_id
    client = MlflowClient(uri)
    model = client.get_logged_model(model_id)
    assert model.status == LoggedModelStatus.READY and model.name == "model"
    assert model.source_run_id == tracker.run_id and model.experiment_id == tracker.experiment_id
    assert [o.model_id for o in client.get_run(tracker.run_id).outputs.model_outputs] == [model_id]
    # The files are an MLflow transformers model, beside the store, loadable back as a generating pipeline.
    folder = Path(model.artifact_location.removeprefix("file://"))
    assert folder.is_relative_to(tmp_path / "outputs" / "mlartifacts")
    mlmodel = (folder / "MLmodel").read_text()
    assert "transformers:" in mlmodel and "text-generation" in mlmodel
    import mlflow.transformers

    components = mlflow.transformers.load_model(f"{model.artifact_location}", return_type="components")
    assert type(components["model"]).__name__ == "Qwen3ForCausalLM"


def test_log_model_without_the_flavors_dependency_warns_and_goes_on(tmp_path: Path, tiny_model: Path, monkeypatch,
                                                                    caplog):
    import sys

    monkeypatch.setitem(sys.modules, "mlflow.transformers", None)  # as if its optional dependency were missing
    uri = seed_store(tmp_path / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        assert tracker.log_model(tiny_model) is None
    tracker.finish()
    assert "model not logged to MLflow" in caplog.text
    assert MlflowClient(uri).get_run(tracker.run_id).info.status == "FINISHED"


def test_log_model_of_a_folder_that_is_no_model_warns(tmp_path: Path, caplog):
    uri = seed_store(tmp_path / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    (tmp_path / "empty").mkdir()
    with caplog.at_level(logging.WARNING):
        assert tracker.log_model(tmp_path / "empty") is None
    assert "not logged to MLflow" in caplog.text
    models = MlflowClient(uri).search_logged_models([tracker.experiment_id])
    assert [m.status for m in models] == [LoggedModelStatus.FAILED]


def test_closing_block_reports_what_is_present(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    full = {"eval/reward": 0.911, "eval_greedy/reward": 0.96, "time/warm_start_total_s": 324.0,
            "time/engine_start_total_s": 90.0, "time/train_total_s": 450.0, "time/eval_total_s": 90.0}
    block = closing_block(status="FINISHED", run_dir=tmp_path / "run", tracker=tracker, metrics=full, wall_s=960.0)
    lines = block.splitlines()
    assert lines[0] == "== agentrl run FINISHED in 16.0 min"
    assert f"run folder    {tmp_path / 'run'}" in lines
    assert f"MLflow        {uri}  experiment t  run {tracker.run_id}" in lines
    assert f"browse        mlflow ui --backend-store-uri {uri}" in lines
    page = f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/{tracker.run_id}"
    assert any(ln.strip() == f"then {page}/model-metrics?workflowType=machine_learning" for ln in lines)
    assert "final eval/reward  0.911 sampled, 0.960 greedy-decoded" in lines  # no per-task files: no grades
    # the engine's start is a stage of its own, and what no stage holds is named too
    assert ("wall time     warm start 5.4 min, engine start 1.5 min, training 7.5 min, eval 1.5 min, other 6 s "
            "(total 16.0 min)") in lines
    # Absent (or non-finite) values are skipped, not printed as nan.
    part = closing_block(status="FAILED", run_dir=tmp_path / "run", tracker=tracker,
                         metrics={"eval/reward": math.nan, "time/train_total_s": 30.0}, wall_s=45.0)
    assert "final eval/reward" not in part and "greedy" not in part and "nan" not in part
    assert "wall time     training 30 s, other 15 s (total 45 s)" in part
    assert part.startswith("== agentrl run FAILED in 45 s")
