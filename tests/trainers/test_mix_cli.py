"""`env=mix` through the real CLI: a run on GridSim and reasoning-gym at once (a short warm start on each bundle's
teacher, two steps), under the built-in GRPO trainer and TRL's, logs finite per-bundle train and eval metrics to
MLflow."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl

TINY = ["trainer.prompts_per_step=4", "trainer.samples_per_prompt=2", "trainer.eval_limit=4",
        "trainer.eval_every=1", "trainer.warm_start.steps=2", "trainer.warm_start.batch_samples=2",
        "agent.max_response_tokens=24", "trainer.max_extra_rows=0", "model.hidden_size=32", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024"]
MIX = ["env=mix", "env.bundles={gridsim:0.5,rg:{env:reasoning_gym,weight:0.5,level:0,train_size:16,eval_size:40}}",
       "env.train_size=32", "env.seed=3"]


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["grpo", "trl"])
def test_two_mixed_steps_log_finite_per_bundle_metrics(trainer: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = [*MIX, f"trainer={trainer}", *TINY, "trainer.steps=2"]
    client = run_agentrl(args, home).client()
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    metrics = run.data.metrics
    for key in ("train/reward", "eval/reward", "eval_greedy/reward", "warm_start/eval/reward"):
        assert math.isfinite(metrics[key]), key
    # eval_limit=4 is stratified by group in proportion to their eval splits (GridSim's 200 days, rg's 40 tasks):
    # three GridSim days (one of each duration) and one rg task. With rg's 4 tasks its share would round to none.
    for group in ("gridsim", "rg"):
        for key in (f"eval/reward/{group}", f"eval_greedy/reward/{group}", f"warm_start/eval/reward/{group}"):
            assert key in metrics and math.isfinite(metrics[key]), f"{key} missing; logged: {sorted(metrics)}"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, f"eval/reward/{group}")]
        assert {1, 2} <= set(steps), steps
    # The two steps' 8 rows, drawn from a 32-row split of 16 + 16 (seeded), hold rows of both groups; a step
    # without a group's row logs no mean for it.
    train = {g: client.get_metric_history(run.info.run_id, f"train/reward/{g}") for g in ("gridsim", "rg")}
    assert train["gridsim"] and train["rg"], f"logged: {sorted(metrics)}"
    assert all(math.isfinite(m.value) for history in train.values() for m in history)
    assert "eval/reward_1h" in metrics or "eval/reward_2h" in metrics or "eval/reward_4h" in metrics
