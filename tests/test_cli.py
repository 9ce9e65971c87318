"""The entry point as a user runs it: dry runs of every recipe, multirun tracking, an installed wheel."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from agentrl.config.register import recipe_names
from agentrl.testing.cli import run_cli
from tests.conftest import REPO


def sqlite_uri(home: Path) -> str:
    return f"sqlite:///{home / 'outputs' / 'mlflow.db'}"


def dry_runs(client: MlflowClient, experiment: str = "agentrl-dry-runs") -> list:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r}"
    return client.search_runs([exp.experiment_id])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [r for r in recipe_names() if r != "gridsim_lora_4b"])  # needs model.path: test_recipe_lora_4b
@pytest.mark.usefixtures("seeded_store")
def test_dry_run_of_each_recipe_prints_the_plan_and_logs_to_the_dry_run_experiment(
        recipe: str, agentrl_home: Path, tmp_path: Path):
    proc = run_cli([f"+recipe={recipe}", "dry_run=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"recipe     {recipe}" in out
    assert "dry run: composed, validated and instantiated" in out
    # Outputs land under the known root, not the working directory (MLflow artifacts included).
    assert f"outputs    {agentrl_home / 'outputs' / 'runs' / recipe}" in out
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlruns").exists()
    client = MlflowClient(sqlite_uri(agentrl_home))
    # A dry run stays out of the experiment that real runs are compared in.
    assert client.get_experiment_by_name("agentrl") is None
    runs = dry_runs(client)
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["choice.recipe"] == recipe
    assert run.data.tags["agentrl.dry_run"] == "true"
    assert run.data.params["task_name"] == recipe
    # The recipe's description is the run's description on its MLflow page.
    assert run.data.tags["mlflow.note.content"] and run.data.params["description"] in run.data.tags["mlflow.note.content"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config_resolved.yaml", "hydra"} <= artifacts
    assert run.info.artifact_uri.startswith((agentrl_home / "outputs" / "mlartifacts").as_uri())
    # The bundle's train and eval splits are the run's dataset inputs.
    contexts = {next(t.value for t in d.tags if t.key == "mlflow.data.context"): d.dataset
                for d in run.inputs.dataset_inputs}
    assert set(contexts) == {"train", "eval"}
    assert all(d.name for d in contexts.values())


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
    assert len(dry_runs(client, "other-dry-runs")) == 1
    assert not (agentrl_home / "outputs" / "mlflow.db").exists()
    # Artifacts sit beside the store it names, not in the working directory.
    assert dry_runs(client, "other-dry-runs")[0].info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.usefixtures("seeded_store")
def test_a_dry_run_may_share_the_experiment_when_asked(agentrl_home: Path, tmp_path: Path):
    proc = run_cli(["+recipe=gridsim_sft", "dry_run=true", "logger.dry_run_experiment=null"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(dry_runs(MlflowClient(sqlite_uri(agentrl_home)), "agentrl")) == 1


@pytest.mark.parametrize("mode", [["--cfg", "job"], ["dry_run=true"]])
@pytest.mark.parametrize("key", ["+trainer.lrr=1", "trainer.lrr=1", "+trainer.warm_start.stepz=3"])
def test_a_key_the_schema_lacks_is_refused_naming_it(key: str, mode: list[str], agentrl_home: Path, tmp_path: Path):
    proc = run_cli(["+recipe=gridsim_grpo", key, *mode], cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout[-2000:]
    name = key.lstrip("+").split("=")[0]
    assert f"full_key: {name}" in proc.stderr, proc.stderr[-2000:]
    assert "lrr: 1" not in proc.stdout and "stepz" not in proc.stdout
    assert not (agentrl_home / "outputs" / "mlflow.db").exists()  # refused before anything was logged


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]],
                         ids=["basic", "joblib"])
@pytest.mark.usefixtures("seeded_store")
def test_multirun_makes_one_parent_and_a_child_per_job(launcher: list[str], agentrl_home: Path, tmp_path: Path):
    """In this process (the basic launcher) or in parallel worker processes (joblib), each job finds the parent."""
    proc = run_cli(["-m", "+recipe=gridsim_grpo", "dry_run=true", "trainer.lr=1e-5,3e-5", *launcher], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(sqlite_uri(agentrl_home))
    assert client.get_experiment_by_name("agentrl") is None  # a sweep of dry runs goes where its jobs go
    runs = dry_runs(client)
    parents = [r for r in runs if r.data.tags.get("agentrl.sweep") == "true"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2 and len(runs) == 3
    assert sorted(float(c.data.params["trainer/lr"]) for c in children) == [1e-5, 3e-5]
    assert all(c.data.tags["choice.trainer"] == "grpo" for c in children)
    # Each job's name: the recipe, the override its jobs vary, the seed and its number in the sweep.
    assert sorted(c.info.run_name for c in children) == ["gridsim_grpo lr=1e-05 seed=0 #0",
                                                         "gridsim_grpo lr=3e-05 seed=0 #1"]
    assert "== agentrl sweep: 2 jobs" in proc.stdout


QUICK_LOOK = ["+recipe=gridsim_quick"]  # the README's quick look
# Smaller still, to keep CI's time sane: the same code paths (warm start, GRPO steps, sampled and greedy evals).
SMALLER = ["trainer.warm_start.steps=30", "trainer.warm_start.augment=0", "trainer.steps=2", "trainer.eval_limit=4",
           "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.max_extra_rows=2"]


def readme_install_line() -> str:
    """The README's install command (the first `pip install` in its first code block), as a user copies it."""
    readme = (REPO / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "pip install" in ln)
    return line[line.index("pip install"):].split("&&")[0].strip()


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_wheel_in_a_fresh_venv_plays_the_quick_look_from_another_directory(tmp_path: Path, agentrl_home: Path):
    """Build the wheel, install it as the README says (constraints, no system site packages), run from elsewhere."""
    install = readme_install_line()
    assert "-c constraints.txt" in install, install  # the README installs the versions the suite passed on
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("agentrl-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    python = str(bin_dir / "python")
    # The README's line with the wheel in place of the checkout ('-e .[dev]'): what a user of the wheel types.
    args = shlex.split(install.replace("-e '.[dev]'", str(wheel)).replace("constraints.txt", str(REPO / "constraints.txt")))
    assert args[:2] == ["pip", "install"] and str(wheel) in args, args
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(env_dir),
           "PYTHONPATH": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run([python, "-m", *args], capture_output=True, text=True, timeout=1500, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    where = tmp_path / "elsewhere"
    where.mkdir()
    probe = subprocess.run([python, "-c", "import agentrl, hydra, sys; print(agentrl.__file__, hydra.__file__)"],
                           cwd=where, capture_output=True, text=True, env=env)
    # agentrl and its dependencies come from the venv: neither the checkout nor the system's site-packages.
    assert probe.returncode == 0 and probe.stdout.count(str(env_dir)) == 2, probe.stdout + probe.stderr

    # Miles is not part of this install: its dry run still prints the command, and says what to install first.
    miles = run_cli(["+recipe=gridsim_miles", "dry_run=true"], cwd=where, python=python, env=env)
    assert miles.returncode == 0, miles.stderr[-3000:]
    assert "<miles_tito_tokenizers>/templates/" in miles.stdout  # a placeholder for the template it lacks
    assert "warning: before the real run" in miles.stdout and "miles-tito-tokenizers" in miles.stdout

    proc = run_cli([*QUICK_LOOK, *SMALLER], cwd=where, python=python, env=env, timeout=2000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    store = agentrl_home / "outputs" / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    (run,) = client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])
    assert run.info.status == "FINISHED"
    # The closing block says where everything is.
    block = out[out.index("== agentrl run FINISHED"):]
    assert f"run folder    {agentrl_home / 'outputs' / 'runs' / 'gridsim_quick'}" in block
    assert f"run {run.info.run_id}" in block and f"sqlite:///{store}" in block
    assert f"mlflow ui --backend-store-uri sqlite:///{store}" in block
    assert "final eval/grade" in block
    # Nothing lands where the user stands; artifacts sit beside the store.
    assert sorted(p.name for p in where.iterdir()) == []
    assert run.info.artifact_uri.startswith((agentrl_home / "outputs" / "mlartifacts").as_uri())
