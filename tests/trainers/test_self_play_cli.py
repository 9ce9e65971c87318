"""`+recipe=textarena_self_play_learns` through the real CLI, shrunk (a 2-step warm start on the heuristic teacher,
two self-play GRPO steps with advantage=rae on a small tiny model): it composes, dry-runs, and logs finite train
and eval metrics (against the scripted random player, by seat) to a real MLflow store."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl

RECIPE = "+recipe=textarena_self_play_learns"
TINY = ["trainer.steps=2", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=4",
        "trainer.eval_every=1", "trainer.warm_start.steps=2", "trainer.warm_start.batch_samples=2",
        "trainer.warm_start.warmup_steps=1", "env.train_size=8", "env.eval_size=4", "agent.max_context_tokens=500",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
        "model.intermediate_size=64", "model.vocab_size=1024", "model.max_position_embeddings=512"]


def test_the_recipe_composes_and_dry_runs_with_its_teacher_and_advantage(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run_agentrl([RECIPE, "--cfg", "job"], home, timeout=600, check=False).process
    assert job.returncode == 0, job.stderr[-3000:]
    for line in ("teacher: heuristic", "advantage: rae", "eval_opponent: random", "train_opponent: null"):
        assert line in job.stdout, line
    dry = run_agentrl([RECIPE, "dry_run=true"], home, timeout=600, check=False).process
    assert dry.returncode == 0 and "dry run: composed, validated and instantiated" in dry.stdout, dry.stderr[-3000:]


@pytest.mark.slow
def test_two_self_play_steps_log_finite_metrics(tmp_path: Path) -> None:
    cli = run_agentrl([RECIPE, *TINY], tmp_path / "home")  # the tiny model TINY describes copied in first
    done = cli.process
    assert "SFT on heuristic" in done.stdout, done.stdout[-3000:]
    client = cli.client()
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    metrics = run.data.metrics
    for key in ("train/reward", "train/loss", "eval/reward", "eval/reward_seat0", "eval/reward_seat1",
                "warm_start/eval/reward", "warm_start/loss"):
        assert key in metrics and math.isfinite(metrics[key]), f"{key} missing; logged: {sorted(metrics)}"
    steps = {m.step for m in client.get_metric_history(run.info.run_id, "train/reward")}
    assert steps == {1, 2}, steps
    assert "-heuristic-" in run.data.tags["agentrl.warm_start"]
