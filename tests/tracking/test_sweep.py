"""Run names a person can tell apart, and a sweep's parent run holding its best job and a table of its jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from agentrl.testing.cli import run_cli
from agentrl.testing.mlflow_store import seed_store
from agentrl.tracking.hydra_callback import MLflowSweepCallback, fixed_keys
from agentrl.tracking.mlflow_tracker import PARENT_RUN_ENV, MLflowTracker
from agentrl.tracking.run_names import run_name, short_keys


def test_a_name_is_the_recipe_the_overrides_that_differ_and_the_seed():
    overrides = ["+recipe=gridsim_grpo", "trainer.steps=5", "trainer.warm_start.steps=100", "model=hf", "seed=3",
                 "dry_run=true", "logger.experiment=x", "~trainer.eval_limit"]
    assert run_name("gridsim_grpo", overrides, 3) == \
        "gridsim_grpo trainer.steps=5 warm_start.steps=100 model=hf ~eval_limit seed=3"
    # In a sweep: only the keys its jobs do not share, and the job's number.
    assert run_name("gridsim_grpo", overrides, 3, fixed_keys=["trainer.warm_start.steps", "model"], job=7) == \
        "gridsim_grpo steps=5 ~eval_limit seed=3 #7"
    assert run_name("r", ["description=" + "x" * 100], 0) == "r seed=0"
    long = run_name("r", [f"trainer.k{i}={'v' * 40}" for i in range(20)], 0, job=12)
    assert len(long) <= 240 and long.endswith("… #12")
    assert short_keys(["a.b.c", "x.b.c", "y"]) == {"a.b.c": "a.b.c", "x.b.c": "x.b.c", "y": "y"}


def test_the_keys_a_sweep_fixes():
    assert fixed_keys(["+recipe=r", "trainer.lr=1e-5,3e-5", "seed=range(3)", "trainer.steps=5"]) == \
        ["recipe", "trainer.steps"]


def _sweep_config(uri: str, tmp_path: Path, direction: str | None):
    sweeper = {"direction": direction} if direction else {}
    return OmegaConf.create({
        "task_name": "gridsim_grpo", "dry_run": False, "seed": 0,
        "logger": {"_target_": "agentrl.tracking.mlflow_tracker.MLflowTracker", "tracking_uri": uri,
                   "experiment": "t", "dry_run_experiment": None, "heartbeat_s": 30},
        "paths": {"output_root": str(tmp_path)},
        "hydra": {"overrides": {"task": ["+recipe=gridsim_grpo", "trainer.lr=1e-5,3e-5", "trainer.steps=5"]},
                  "sweeper": sweeper},
    })


@pytest.mark.parametrize(("direction", "best_job"), [(None, 1), ("minimize", 0)])
def test_the_parent_holds_the_best_job_its_params_and_a_table(direction: str | None, best_job: int, tmp_path: Path,
                                                              monkeypatch, capsys):
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    uri = seed_store(tmp_path / "mlflow.db")
    config = _sweep_config(uri, tmp_path, direction)
    callback = MLflowSweepCallback()
    callback.on_multirun_start(config)
    # Three jobs as the launcher runs them; two share their overrides, the third failed with the highest score.
    jobs = [("1e-05", 0.5, "FINISHED"), ("3e-05", 0.9, "FINISHED"), ("1e-05", 0.99, "FAILED")]
    ids = []
    for num, (lr, score, status) in enumerate(jobs):
        cfg = OmegaConf.create({"dry_run": False, "task_name": "gridsim_grpo", "seed": 0, "trainer": {"lr": lr}})
        tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
        ids.append(tracker.start(cfg, choices={"recipe": "gridsim_grpo"}, run_dir=tmp_path / str(num),
                                 overrides=["+recipe=gridsim_grpo", f"trainer.lr={lr}", "trainer.steps=5"],
                                 sweep_job=num))
        tracker.log({"eval/reward": score}, step=5)
        tracker.finish(status)
    callback.on_multirun_end(config)

    client = MlflowClient(uri)
    names = [client.get_run(i).info.run_name for i in ids]
    assert names == ["gridsim_grpo lr=1e-05 seed=0 #0", "gridsim_grpo lr=3e-05 seed=0 #1",
                     "gridsim_grpo lr=1e-05 seed=0 #2"]
    parent = next(r for r in client.search_runs([client.get_experiment_by_name("t").experiment_id])
                  if r.data.tags.get("agentrl.sweep") == "true")
    assert parent.info.status == "FINISHED" and parent.info.run_name == "gridsim_grpo sweep over lr"
    best = client.get_run(ids[best_job])
    assert parent.data.metrics["best/eval/reward"] == best.data.metrics["eval/reward"]  # the failed job's 0.99 not
    assert parent.data.tags["agentrl.sweep.best_run_id"] == best.info.run_id
    assert parent.data.params == best.data.params and parent.data.params["trainer/lr"] == jobs[best_job][0]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"sweep_jobs.json", "sweep_jobs.txt"} <= artifacts
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "sweep_jobs.json", str(tmp_path)))
                       .read_text())
    assert table["columns"][:4] == ["job", "run name", "status", "eval/reward"]
    assert [row[1] for row in table["data"]] == names
    # The console gets the same table, the best job marked.
    out = capsys.readouterr().out
    assert "== agentrl sweep: 3 jobs" in out
    marked = [ln for ln in out.splitlines() if ln.startswith("* ")]
    assert len(marked) == 1 and names[best_job] in marked[0]
    assert f"sweep's MLflow run {parent.info.run_id}" in out


@pytest.mark.slow
@pytest.mark.usefixtures("seeded_store")
def test_a_real_sweep_names_its_jobs_apart_and_prints_its_table(agentrl_home: Path, tmp_path: Path):
    """Three short SFT jobs, two with the same overrides: three names; the parent holds the best of them."""
    proc = run_cli(["-m", "+recipe=gridsim_sft", "trainer.steps=1,2,1", "trainer.eval_limit=2", "trainer.augment=0",
                    "trainer.batch_samples=2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{agentrl_home / 'outputs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("agentrl.sweep") == "true")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    names = sorted(c.info.run_name for c in children)
    assert names == ["gridsim_sft steps=1 seed=0 #0", "gridsim_sft steps=1 seed=0 #2", "gridsim_sft steps=2 seed=0 #1"]
    best = max(c.data.metrics["eval/reward"] for c in children)
    assert parent.data.metrics["best/eval/reward"] == best
    best_run = client.get_run(parent.data.tags["agentrl.sweep.best_run_id"])
    assert best_run.data.metrics["eval/reward"] == best and parent.data.params == best_run.data.params
    assert "== agentrl sweep: 3 jobs" in proc.stdout
    assert all(name in proc.stdout for name in names)
