"""model.lora through the real CLI (issue 32): two GRPO steps from a LoRA warm start under agent=tool_calling,
and under agent=co_evolution with a role on its own trained model and a frozen one; `agentrl eval` of the
LoRA run's final model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl
from agentrl.testing.tiny_models import seed_tiny_model

SHAPE = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
         "model.intermediate_size=64", "model.vocab_size=1024", "agent.max_response_tokens=24"]
LORA = ["model.lora.enabled=true", "model.lora.rank=4", "trainer.lr=2e-3"]
STEPS = ["trainer.steps=2", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=2",
         "trainer.eval_every=0", "trainer.checkpoint_every=1", "trainer.max_extra_rows=0",
         "trainer.warm_start.steps=2", "trainer.warm_start.batch_samples=2",
         # a 2-step warm start rarely earns differing rewards: train (and push) on every group regardless
         "trainer.drop_no_signal=false", "trainer.model_failures=penalize"]


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    return run_agentrl(args, home, check=False).process


def _run_id(stdout: str) -> str:
    line = next(x for x in stdout.splitlines() if x.startswith("MLflow "))
    return line.split(" run ")[-1].strip()


def _adapter_bytes(folder: Path) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() * t.element_size() for t in load_file(str(folder / "adapter_model.safetensors")).values())


def _is_adapter_of(folder: Path, base: Path) -> bool:
    config = json.loads((folder / "adapter_config.json").read_text())
    return Path(config["base_model_name_or_path"]) == base and not (folder / "model.safetensors").exists()


@pytest.mark.slow
def test_lora_two_steps_tool_calling_then_eval_of_its_final_model(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    home = tmp_path / "home"
    args = [*SHAPE, *STEPS, *LORA, "trainer.warm_start.enabled=true"]
    done = _cli(args, home)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "note       LoRA rank 4" in done.stdout and "parameters trained" in done.stdout
    base = next((home / "outputs" / "models").iterdir())
    # The warm start, every checkpoint and the final model are adapters on the base, not copies of it.
    warm = next((home / "outputs" / "checkpoints" / "sft").iterdir())
    assert _is_adapter_of(warm, base)
    run_dir = next((home / "outputs" / "runs" / "train").iterdir())
    final = run_dir / "final_model"
    assert _is_adapter_of(final, base)
    assert _is_adapter_of(next((home / "outputs" / "checkpoints").glob("*/*/step-000002")) / "model", base)

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    run_id = _run_id(done.stdout)
    pushed = [m.value for m in client.get_metric_history(run_id, "time/weight_push_bytes")]
    updates = [m.value for m in client.get_metric_history(run_id, "train/updates")]
    base_bytes = (base / "model.safetensors").stat().st_size
    # Each step that trained pushed the adapter alone (its bytes, a few % of the base's); none re-sent the base.
    assert len(pushed) == 2 and any(updates)
    assert all(b == (_adapter_bytes(final) if u else 0.0) for b, u in zip(pushed, updates, strict=True)), pushed
    assert max(pushed) < base_bytes / 10
    (logged,) = client.search_logged_models(experiment_ids=[client.get_run(run_id).info.experiment_id])
    assert logged.tags["agentrl.lora_base"] == str(base)
    assert {a.path for a in client.list_logged_model_artifacts(logged.model_id)} >= {"adapter_config.json",
                                                                                    "adapter_model.safetensors"}

    ev = _cli(["eval", f"eval.model={run_id}", "eval.samples=1", "eval.limit=2", *SHAPE], home)
    assert ev.returncode == 0, ev.stderr[-4000:]
    assert client.get_run(_run_id(ev.stdout)).data.tags["agentrl.eval.model"] == str(final)

    # A third step resumes from the step-2 checkpoint: the adapter on its base, and the adapter's AdamW state.
    more = _cli([*args, "trainer.steps=3", "trainer.resume=latest"], home)
    assert more.returncode == 0, more.stderr[-4000:]
    assert "resuming from" in more.stdout and "at step 3" in more.stdout
    assert len(client.get_metric_history(run_id, "time/weight_push_bytes")) == 3


@pytest.mark.slow
def test_lora_two_steps_co_evolution_one_adapter_per_trained_role_none_for_the_frozen(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    home = tmp_path / "home"
    base = seed_tiny_model(SHAPE, home / "outputs" / "models")
    # The rewriter plays a model of its own (trained: its own adapter), the selector a frozen one (no adapter).
    for role in ("rewriter", "selector"):
        shutil.copytree(base, tmp_path / role)
    args = ["+recipe=arith_co_evolution", *SHAPE, *STEPS, *LORA, "agent.num_parallel=2", "agent.max_response_tokens=12",
            f"agent.roles.1.model={tmp_path / 'rewriter'}", f"agent.roles.2.model={tmp_path / 'selector'}",
            "agent.roles.2.frozen=true"]
    done = _cli(args, home)
    assert done.returncode == 0, done.stderr[-4000:]
    saved = next((home / "outputs" / "checkpoints").glob("*/*/step-000002"))
    assert _is_adapter_of(saved / "model", base)
    assert _is_adapter_of(saved / "policies" / "rewriter", tmp_path / "rewriter")
    assert not (saved / "policies" / "selector").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    metrics = client.get_run(_run_id(done.stdout)).data.metrics
    assert "train/rewriter/updates" in metrics and not any(k.startswith("train/selector/") for k in metrics)
    assert "time/weight_push_bytes" in metrics
