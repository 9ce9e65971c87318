"""`reward=rubric` under `trainer=trl` through the real CLI: TRL's rollout_func scores each play with the rubric
tree (a weighted sum of the env's grade and a format check) and each part reaches MLflow per step, as under the
built-in trainer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl

RUBRIC = ("reward.rubric={_target_:agentrl.rubrics.WeightedSum,"
          "parts:{grade:{_target_:agentrl.rubrics.Score,name:grade},"
          "format:{_target_:agentrl.rubrics.Format,pattern:submit_schedule}},"
          "weights:{grade:0.8,format:0.2}}")
# A reply cut at max_response_tokens without a tool call is flagged truncated and not scored, so it records no rubric
# part: the warm start teaches the schedule call (as test_trl's) and the recipe's 96 tokens hold it (~35 tokens).
TINY = ["trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=2", "trainer.eval_every=0",
        "trainer.temperature=0.6", "trainer.warm_start.steps=150", "trainer.warm_start.batch_samples=8",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
        "model.intermediate_size=64", "model.vocab_size=1024"]


@pytest.mark.slow
def test_two_trl_steps_log_each_rubric_part(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["+recipe=gridsim_grpo", "trainer=trl", "reward=rubric", RUBRIC, *TINY, "trainer.steps=2"]
    client = run_agentrl(args, home).client()
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["reward/_target_"] == "agentrl.rubrics.RubricReward"
    for part in ("grade", "format", "total"):
        history = client.get_metric_history(run.info.run_id, f"train/rubric/{part}")
        assert [m.step for m in history] == [1, 2], f"train/rubric/{part}: {history}; logged {sorted(run.data.metrics)}"
        assert all(math.isfinite(m.value) and 0.0 <= m.value <= 1.0 for m in history), history
        assert math.isfinite(run.data.metrics[f"eval/rubric/{part}"]), part
    # The trained reward is the tree's total: 0.8 x grade + 0.2 x format, per rollout, so in the step's mean too.
    for step in (1, 2):
        at = {p: next(m.value for m in client.get_metric_history(run.info.run_id, f"train/rubric/{p}")
                      if m.step == step) for p in ("grade", "format", "total")}
        assert at["total"] == pytest.approx(0.8 * at["grade"] + 0.2 * at["format"], abs=1e-6), at
