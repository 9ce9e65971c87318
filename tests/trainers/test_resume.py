"""`trainer.resume=latest|<run id>|<folder>` through the real CLI: what a dry run says it would resume, a
mismatched config refused naming the keys (unless forced, then tagged), resume by run id and by folder into
the checkpoint's own MLflow run, and trainer=trl resuming from TRL's own checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl
from agentrl.trainers.common.resume import identity, resume_mode

TINY = ["trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=3", "trainer.eval_every=0",
        "trainer.checkpoint_every=1", "trainer.warm_start.steps=2", "trainer.warm_start.batch_samples=2",
        "agent.max_response_tokens=24", "trainer.max_extra_rows=0", "model.hidden_size=32", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024"]


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    return run_agentrl(args, home, check=False).process


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return done.stdout


def _run_id(stdout: str) -> str:
    return re.findall(r"MLflow\s+\S+\s+experiment \S+\s+run (\w+)", stdout)[-1]


def _client(home: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")


def _real_runs(home: Path) -> list:
    client = _client(home)
    return client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])


def test_resume_values_and_the_old_spellings() -> None:
    assert [resume_mode(v) for v in (None, False, "false", "False", "null", "")] == [None] * 6
    assert [resume_mode(v) for v in (True, "true", "True", "latest")] == ["latest"] * 4
    assert resume_mode("3f2c0a") == "3f2c0a" and resume_mode("/ckpt/run") == "/ckpt/run"
    # A checkpoint's paths under the project root compare relative to it; runtime keys never count.
    one = {"paths": {"root": "/a"}, "model": {"path": "/a/outputs/models/m"}, "env": {"server": {"port": 1}}}
    two = {"paths": {"root": "/b"}, "model": {"path": "/b/outputs/models/m"}, "env": {"server": {"port": 2}}}
    assert identity(one, {}) == identity(two, {})


@pytest.mark.slow
def test_grpo_resume_by_run_id_and_folder_and_a_mismatch_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["+recipe=gridsim_grpo", *TINY]
    first = _run_id(_ok(_cli([*args, "trainer.steps=1"], home)))
    root = home / "outputs" / "checkpoints" / "gridsim_grpo" / first
    step1 = root / "step-000001"
    assert json.loads((step1 / "agentrl_run.json").read_text())["run_id"] == first

    # The dry run names the checkpoint, its step and the run a real run would reopen, and leaves that run alone.
    dry = _ok(_cli([*args, "trainer.steps=2", f"trainer.resume={first}", "dry_run=true"], home))
    assert re.search(rf"resume\s+{re.escape(str(step1))} \(step 1; continues at step 2\) into MLflow run {first}", dry)
    assert re.search(r"dry run: .* MLflow run (\w+) in experiment agentrl-dry-runs", dry).group(1) != first
    assert _client(home).get_run(first).info.status == "FINISHED"

    # The case: a model=hf resume of a model=tiny checkpoint is refused at plan time, naming the keys.
    tiny = next((home / "outputs" / "models").glob("tiny-*"))  # the same weights, named as a Hugging Face folder
    not_tiny = [a for a in args if not a.startswith("model.")]  # the tiny model's own keys: hf has none
    hf = _cli([*not_tiny, "trainer.steps=2", "trainer.resume=latest", "model=hf", f"model.path={tiny}"], home)
    assert hf.returncode != 0
    said = hf.stdout + hf.stderr
    assert "choice of model" in said and "model._target_" in said and "model.hidden_size" in said, said[-3000:]
    assert "trainer.resume_force=true" in said
    # A typo'd run id is named, with the runs that do have checkpoints.
    typo = _cli([*args, "trainer.steps=2", f"trainer.resume={first[:-1]}x"], home)
    assert typo.returncode != 0 and f"no checkpoint of an MLflow run {first[:-1]}x" in typo.stderr
    assert first in typo.stderr
    assert len(_real_runs(home)) == 1, "a refused resume must leave no run behind"

    # By run id: step 2 in the same MLflow run.
    out = _ok(_cli([*args, "trainer.steps=2", f"trainer.resume={first}"], home))
    assert f"resuming from {step1} at step 2" in out and _run_id(out) == first
    # By folder (the run's checkpoint folder: its newest checkpoint, step 2): step 3, same run.
    out = _ok(_cli([*args, "trainer.steps=3", f"trainer.resume={root}"], home))
    assert f"resuming from {root / 'step-000002'} at step 3" in out and _run_id(out) == first
    # Forced past a difference: the run keeps its params, and is tagged with what changed.
    out = _ok(_cli([*args, "trainer.steps=4", f"trainer.resume={root}", "env.prompt_style=full",
                    "trainer.resume_force=true"], home))
    assert f"resuming from {root / 'step-000003'} at step 4" in out
    runs = _real_runs(home)
    assert [r.info.run_id for r in runs] == [first]
    run = runs[0]
    assert run.data.params["env/prompt_style"] == "compact"  # the recipe's, as the run started
    assert run.data.tags["agentrl.resume.forced"] == "true"
    assert 'env.prompt_style: "compact" -> "full"' in run.data.tags["agentrl.resume.differences"]
    # the schedule it was extended to: allowed, and on the run, since its params keep the first run's
    assert run.data.tags["agentrl.resume.trainer_changes"] == "trainer.steps: 3 -> 4"
    steps = sorted(m.step for m in _client(home).get_metric_history(first, "train/reward"))
    assert steps == [1, 2, 3, 4]
    assert "resume-step-3/config_resolved.yaml" in [a.path for a in _client(home).list_artifacts(first, "resume-step-3")]


@pytest.mark.slow
def test_trl_resumes_from_its_own_checkpoint(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["+recipe=gridsim_grpo", "trainer=trl", *TINY]
    first = _run_id(_ok(_cli([*args, "trainer.steps=1"], home)))
    root = home / "outputs" / "checkpoints" / "gridsim_grpo" / first
    assert (root / "checkpoint-1" / "trainer_state.json").is_file()
    # A run of another trainer is not this one's to resume: a grpo resume finds no checkpoint of its own kind.
    grpo = _cli(["+recipe=gridsim_grpo", *TINY, "trainer.steps=2", f"trainer.resume={first}"], home)
    assert grpo.returncode != 0 and f"no checkpoint of an MLflow run {first}" in grpo.stderr

    out = _ok(_cli([*args, "trainer.steps=2", "trainer.resume=latest"], home))
    assert f"resuming from {root / 'checkpoint-1'} at step 2" in out and _run_id(out) == first
    # TRL restored its own state (its log history holds the first run's step) and went on from step 1.
    state = json.loads((root / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2]
    saved = json.loads((root / "checkpoint-2" / "agentrl_run.json").read_text())
    assert saved["run_id"] == first
    assert [p[0] for p in saved["history"]["train/reward"]] == [1, 2]  # the curve goes on across the resume
    client = _client(home)
    assert [r.info.run_id for r in _real_runs(home)] == [first]
    assert sorted(m.step for m in client.get_metric_history(first, "train/reward")) == [1, 2]
    assert sorted(m.step for m in client.get_metric_history(first, "eval/reward")) == [0, 1, 2]


def test_trainer_changes_name_the_schedule_a_resume_changed_and_not_its_own_keys() -> None:
    from agentrl.config.schema import settings_dict
    from agentrl.plan import typed_settings
    from agentrl.testing.config import compose_config
    from agentrl.trainers.common.resume import trainer_changes

    before = typed_settings(compose_config("+recipe=gridsim_grpo", "trainer.steps=100"))
    record = {"config": settings_dict(before), "choices": {}}
    now = typed_settings(compose_config("+recipe=gridsim_grpo", "trainer.steps=200", "trainer.lr=1e-5",
                                        "trainer.resume=latest", "trainer.resume_force=true"))
    assert trainer_changes(record, now) == ["trainer.lr: 5e-05 -> 1e-05", "trainer.steps: 100 -> 200"]
    assert trainer_changes(record, before) == []
