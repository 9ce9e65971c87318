"""`reward=rubric` from config: the plan builds the tree from `_target_` nodes, and a mistake in it (an unknown
score name, a bad weight, a misspelled key, a target outside agentrl) fails when the plan is built, naming its
key; the tree's parts become metrics of the built-in trainer's step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.agents.record import Rollout
from agentrl.plan import PlanError, build_plan
from agentrl.rubrics import Format, RubricReward, Score, WeightedSum
from agentrl.testing.config import compose_config
from agentrl.trainers.common.rollout_metrics import rollout_metrics

S = "{_target_: agentrl.rubrics.Score, name: grade}"


composed = compose_config


def plan(tmp_path: Path, *overrides: str) -> Any:
    cfg = composed("reward=rubric", f"paths.output_root={tmp_path}", *overrides)
    return build_plan(cfg, choices={"reward": "rubric"}, run_dir=tmp_path / "run")


def test_the_default_tree_is_the_episodes_one_score(tmp_path: Path):
    reward = plan(tmp_path).reward
    assert isinstance(reward, RubricReward) and isinstance(reward.rubric, Score) and reward.rubric.name is None


def test_a_tree_of_targets_builds_openenv_rubrics(tmp_path: Path):
    reward = plan(tmp_path, "reward.rubric={_target_: agentrl.rubrics.WeightedSum, parts: {grade: " + S + ", "
                  "format: {_target_: agentrl.rubrics.Format, pattern: submit_schedule}}, "
                  "weights: {grade: 0.8, format: 0.2}}").reward
    from openenv.core.rubrics import Rubric
    from openenv.core.rubrics import WeightedSum as OpenEnvWeightedSum

    assert isinstance(reward.rubric, WeightedSum) and isinstance(reward.rubric, OpenEnvWeightedSum)
    assert isinstance(reward.rubric.parts["format"], Format) and isinstance(reward.rubric.parts["format"], Rubric)
    assert reward.rubric.weights == [0.8, 0.2]


@pytest.mark.parametrize("overrides, named", [
    (["reward.rubric={_target_: agentrl.rubrics.Score, name: grde}"],
     "reward.rubric.name='grde': bundle gridsim scores no such thing; its scores are ['grade']"),
    (["env=arith", "reward.rubric={_target_: agentrl.rubrics.WeightedSum, parts: {ok: {_target_: agentrl.rubrics.Score,"
      " name: grade}}, weights: {ok: 1.0}}"], "reward.rubric.parts.ok.name='grade': bundle arith"),
    (["reward.rubric={_target_: agentrl.rubrics.WeightedSum, parts: {a: " + S + ", b: " + S + "}, "
      "weights: {a: 1.5, b: -0.5}}"], "weights.b=-0.5: a weight is a finite number >= 0"),
    (["reward.rubric={_target_: agentrl.rubrics.WeightedSum, parts: {a: " + S + "}, weights: {a: 0.7}}"],
     "weights sum to 0.7"),
    (["reward.rubric={_target_: agentrl.rubrics.WeightedSum, parts: {a: {_target_: agentrl.rubrics.Score, nme: x}},"
      " weights: {a: 1.0}}"], "reward.rubric.parts.a: agentrl.rubrics.Score does not accept the config's keys"),
    (["reward.rubric={_target_: agentrl.rubrics.Gate, rubric: {_target_: os.system, command: ls}}"],
     "reward.rubric.rubric._target_ must name something under agentrl.*"),
    (["reward.rubric={_target_: agentrl.rubrics.Judge, url: 'http://127.0.0.1:1', timeout_s: -1}"],
     "reward.rubric: ValueError: timeout_s=-1"),
    (["reward.weight={_target_: agentrl.rubrics.Threshold, rubric: {_target_: agentrl.rubrics.Score, name: right}}"],
     "reward.weight.rubric.name='right'"),
])
def test_a_mistake_in_the_tree_fails_at_plan_time_naming_its_key(tmp_path: Path, overrides: list[str], named: str):
    with pytest.raises(PlanError) as caught:
        plan(tmp_path, *overrides)
    assert named in str(caught.value)


def test_a_misspelled_group_key_is_refused():
    with pytest.raises(Exception, match="rubrc"):
        composed("reward=rubric", "reward.rubrc=1")


def test_each_part_is_a_train_metric_of_the_step():
    group = RubricReward(WeightedSum(parts={"grade": Score(name="grade"), "format": Format(pattern="ok")},
                                     weights={"grade": 0.5, "format": 0.5}))
    rollouts = [Rollout(scores={"grade": 1.0}, answer="ok"), Rollout(scores={"grade": 0.5}, answer="no")]
    for r in rollouts:
        r.score = r.reward = group.score_rollout(r)
    metrics = rollout_metrics(rollouts)
    assert metrics["train/rubric/grade"] == 0.75 and metrics["train/rubric/format"] == 0.5
    assert metrics["train/rubric/total"] == metrics["train/reward"] == pytest.approx((1.0 + 0.25) / 2)


@pytest.mark.parametrize("cls, schema", [
    ("Score", "ScoreNodeConfig"), ("Format", "FormatNodeConfig"), ("Gate", "GateNodeConfig"),
    ("Threshold", "ThresholdNodeConfig"), ("Judge", "JudgeConfig"), ("RubricReward", "RubricRewardConfig"),
])
def test_each_nodes_defaults_are_its_schemas(cls: str, schema: str):
    import dataclasses
    import inspect

    import agentrl.config.reward as schemas
    import agentrl.rubrics as rubrics

    fields = {f.name: f.default for f in dataclasses.fields(getattr(schemas, schema))
              if f.name != "_target_" and f.default is not dataclasses.MISSING}
    params = {n: p.default for n, p in inspect.signature(getattr(rubrics, cls)).parameters.items()
              if p.default is not inspect.Parameter.empty}
    assert params == fields
