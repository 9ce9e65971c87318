"""The entry point as a user runs it: dry runs of every recipe, multirun tracking, an installed wheel."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from agentrl.config.register import recipe_names
from tests.conftest import REPO, run_cli


def sqlite_uri(home: Path) -> str:
    return f"sqlite:///{home / 'outputs' / 'mlflow.db'}"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [r for r in recipe_names() if r != "gridsim_miles"])
def test_dry_run_of_each_recipe_prints_the_plan_and_logs_a_run(recipe: str, agentrl_home: Path, tmp_path: Path):
    proc = run_cli([f"+recipe={recipe}", "dry_run=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"recipe     {recipe}" in out
    assert "dry run: composed, validated and instantiated" in out
    # Outputs land under the known root, not the working directory.
    assert f"outputs    {agentrl_home / 'outputs' / 'runs' / recipe}" in out
    assert not (tmp_path / "outputs").exists()
    client = MlflowClient(sqlite_uri(agentrl_home))
    runs = client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["choice.recipe"] == recipe
    assert run.data.tags["agentrl.dry_run"] == "true"
    assert run.data.params["task_name"] == recipe
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config_resolved.yaml", "hydra"} <= artifacts


def test_unknown_recipe_fails_listing_the_recipes(agentrl_home: Path, tmp_path: Path):
    proc = run_cli(["+recipe=gridsim_grpoo", "dry_run=true"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "Could not find 'recipe/gridsim_grpoo'" in proc.stderr
    for name in recipe_names():
        assert name in proc.stderr


def test_tracking_uri_override_is_honoured(agentrl_home: Path, tmp_path: Path):
    store = tmp_path / "elsewhere.db"
    proc = run_cli(["+recipe=gridsim_sft", "dry_run=true", f"logger.tracking_uri=sqlite:///{store}",
                    "logger.experiment=other"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{store}")
    assert len(client.search_runs([client.get_experiment_by_name("other").experiment_id])) == 1
    assert not (agentrl_home / "outputs" / "mlflow.db").exists()


@pytest.mark.slow
def test_multirun_makes_one_parent_and_a_child_per_job(agentrl_home: Path, tmp_path: Path):
    proc = run_cli(["-m", "+recipe=gridsim_grpo", "dry_run=true", "trainer.lr=1e-5,3e-5"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(sqlite_uri(agentrl_home))
    exp = client.get_experiment_by_name("agentrl").experiment_id
    runs = client.search_runs([exp])
    parents = [r for r in runs if r.data.tags.get("agentrl.sweep") == "true"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2 and len(runs) == 3
    assert sorted(float(c.data.params["trainer/lr"]) for c in children) == [1e-5, 3e-5]
    assert all(c.data.tags["choice.trainer"] == "grpo" for c in children)


@pytest.mark.slow
def test_non_editable_install_runs_from_another_directory(tmp_path: Path, agentrl_home: Path):
    env_dir = tmp_path / "venv"
    # System site packages provide the heavy dependencies; agentrl itself comes from the wheel.
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(REPO)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    where = tmp_path / "elsewhere"
    where.mkdir()
    probe = subprocess.run([python, "-c", "import agentrl, sys; print(agentrl.__file__)"], cwd=where,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert str(env_dir) in probe.stdout, probe.stdout + probe.stderr  # the wheel, not the checkout
    proc = run_cli(["+recipe=gridsim_grpo", "dry_run=true"], cwd=where, python=python,
                   env={"PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recipe     gridsim_grpo" in proc.stdout
    assert (agentrl_home / "outputs" / "mlflow.db").exists()

