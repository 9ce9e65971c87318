"""Bringing your own model (`model=hf`) through the real CLI: the plan refuses a missing or wrong folder and a
chat template it cannot train on, before any MLflow run exists; a folder with a stock chat template (the tiny
model saved with a Qwen3-style template, no downloads) plans and trains two GRPO steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "models"))
from stock_templates import MISMATCHED_PROMPT, QWEN3_STYLE, save_with_template  # noqa: E402

from agentrl.testing.cli import run_agentrl  # noqa: E402

SMALL = {"seed": 0, "vocab_size": 1024, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
         "intermediate_size": 64}
QUICK = ["trainer.steps=2", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=2",
         "trainer.eval_every=1", "trainer.checkpoint_every=0", "trainer.warm_start.enabled=true",
         "trainer.warm_start.steps=2",
         "trainer.warm_start.batch_samples=2", "agent.max_response_tokens=24", "trainer.max_extra_rows=0",
         "trainer.model_failures=penalize", "trainer.drop_no_signal=false", "trainer.threads=1"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    from agentrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(str(tmp_path_factory.mktemp("models") / "tiny"), **SMALL)


def cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    """The run in `home`, its store left for the run to make: a refused plan must leave none."""
    return run_agentrl(args, home, seed_model=False, seed_store=False, check=False, timeout=1200).process


def mlflow_runs(home: Path) -> list:
    """Every run in the store (none when no store was ever made)."""
    if not (home / "mlflow.db").exists():
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.parametrize(("args", "says"), [
    (["model=hf"], "agentrl: model.path is not set: model=hf needs a local Hugging Face folder"),
    (["model=hf", "model.path=/no/such/model"], "agentrl: model: FileNotFoundError: model.path='/no/such/model' is "
                                                "not a folder"),
])
def test_a_missing_or_wrong_path_fails_at_plan_time_leaving_no_run(tmp_path: Path, args: list[str], says: str):
    done = cli(["+recipe=gridsim_grpo", *args], tmp_path)
    assert done.returncode != 0
    assert says in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert mlflow_runs(tmp_path) == []


def test_a_template_without_the_prefix_property_fails_the_dry_run(tmp_path: Path, tiny_folder: str):
    folder = save_with_template(tiny_folder, str(tmp_path / "odd"), MISMATCHED_PROMPT)
    done = cli(["+recipe=gridsim_grpo", "model=hf", f"model.path={folder}", "dry_run=true"], tmp_path)
    assert done.returncode != 0
    assert f"agentrl: model.path={folder}: the chat template lacks the prefix property" in done.stderr, \
        done.stderr[-3000:]
    assert mlflow_runs(tmp_path) == []


def test_a_tool_format_the_template_does_not_write_fails_the_dry_run(tmp_path: Path, tiny_folder: str):
    folder = save_with_template(tiny_folder, str(tmp_path / "stock"), QWEN3_STYLE)
    done = cli(["+recipe=gridsim_grpo", "model=hf", f"model.path={folder}", "model.tool_format=llama3",
                "dry_run=true"], tmp_path)
    assert done.returncode != 0
    assert "model.tool_format=llama3 cannot read the tool calls this chat template writes" in done.stderr
    assert "model.tool_format=qwen reads them" in done.stderr


@pytest.mark.slow
def test_a_stock_template_plans_and_trains_two_grpo_steps(tmp_path: Path, tiny_folder: str):
    folder = save_with_template(tiny_folder, str(tmp_path / "stock"), QWEN3_STYLE)
    dry = cli(["+recipe=gridsim_grpo", "model=hf", f"model.path={folder}", "dry_run=true"], tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "note       chat template: no {% generation %} blocks; assistant tokens taken from prefix renders" \
        in dry.stdout
    # A model=hf folder is taken as pretrained: no warm start unless asked for (QUICK asks below).
    assert "stages     no warm start (a pretrained model starts from itself" in dry.stdout
    done = cli(["+recipe=gridsim_grpo", "model=hf", f"model.path={folder}", *QUICK, "trainer.lr_warmup_steps=2",
                "model.gradient_checkpointing=true"], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = [r for r in mlflow_runs(tmp_path) if r.data.params.get("dry_run") == "False"]
    assert run.info.status == "FINISHED"
    tokens = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/tokens")}
    assert sorted(tokens) == [1, 2] and all(v > 0 for v in tokens.values()), tokens
    # The warmup's rate at step 1 is half the full one at step 2 (trainer.lr_warmup_steps=2).
    lr = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/lr")}
    assert lr[1] == pytest.approx(lr[2] / 2)
    # The warm start trained on the stock template's assistant turns (its loss is logged).
    assert client.get_metric_history(run.info.run_id, "warm_start/loss")
