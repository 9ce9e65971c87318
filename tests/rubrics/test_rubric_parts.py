"""Each rubric node of `reward=rubric` against rewards computed by hand, on real `Rollout`/`Play` records; and the
`asymmetric` weighting as a rubric, equal to `reward=asymmetric` on the same plays."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.agents.record import Failure, Play, Rollout
from agentrl.rewards import Asymmetric, apply_rewards, reward_play, rubric_metrics
from agentrl.rubrics import Format, Gate, RubricReward, Score, Sequential, Threshold, WeightedSum

ROW = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2+3?"}]}


def rewarded(group: RubricReward, *rollouts: Rollout, **play: object) -> list[Rollout]:
    return asyncio.run(reward_play(group, Play(list(rollouts), **play), ROW))


def one(group: RubricReward, scores: dict[str, float] | None, answer: str = "") -> Rollout:
    [r] = rewarded(group, Rollout(scores=scores, answer=answer))
    return r


def test_a_score_is_the_named_env_score_and_without_a_name_the_only_one():
    assert one(RubricReward(Score(name="speed")), {"grade": 0.25, "speed": 0.75}).reward == 0.75
    assert one(RubricReward(Score()), {"grade": 0.25}).reward == 0.25
    assert one(RubricReward(), {"grade": 0.5}).reward == 0.5  # the default tree


def test_a_weighted_sum_of_named_scores_and_a_format_check_matches_the_hand_sum():
    group = RubricReward(WeightedSum(
        parts={"grade": Score(name="grade"), "speed": Score(name="speed"), "format": Format(pattern=r"^\d+$")},
        weights={"grade": 0.5, "speed": 0.3, "format": 0.2}))
    r = one(group, {"grade": 0.6, "speed": 0.5}, answer=" 42 ")
    assert r.reward == pytest.approx(0.5 * 0.6 + 0.3 * 0.5 + 0.2 * 1.0)
    assert r.rubric == pytest.approx({"grade": 0.6, "speed": 0.5, "format": 1.0, "total": 0.65})
    bad_format = one(group, {"grade": 0.6, "speed": 0.5}, answer="forty-two")
    assert bad_format.reward == pytest.approx(0.5 * 0.6 + 0.3 * 0.5)
    assert bad_format.rubric["format"] == 0.0


def test_a_format_rubric_matches_anywhere_or_the_whole_answer():
    assert one(RubricReward(Format(pattern="submit")), {}, answer="please submit it").reward == 1.0
    assert one(RubricReward(Format(pattern="submit", full=True)), {}, answer="please submit it").reward == 0.0
    assert one(RubricReward(Format(pattern=r"submit.*", full=True)), {}, answer="submit it").reward == 1.0


def test_a_gate_passes_its_child_at_the_threshold_and_zeroes_it_below():
    group = RubricReward(Gate(Score(name="grade"), threshold=0.5))
    assert [one(group, {"grade": g}).reward for g in (0.49, 0.5, 0.9)] == [0.0, 0.5, 0.9]


def test_sequential_stops_at_the_first_zero_and_otherwise_gives_the_last_score():
    group = RubricReward(Sequential(parts={"format": Format(pattern="submit"), "grade": Score(name="grade")}))
    passed = one(group, {"grade": 0.7}, answer="submit 3")
    assert (passed.reward, passed.rubric) == (0.7, {"format": 1.0, "grade": 0.7, "total": 0.7})
    stopped = one(group, {"grade": 0.7}, answer="no")
    assert (stopped.reward, stopped.rubric) == (0.0, {"format": 0.0, "total": 0.0})  # grade never evaluated


def test_nested_parts_are_named_by_their_path_through_a_gate():
    inner = WeightedSum(parts={"a": Score(name="a"), "b": Score(name="b")}, weights={"a": 0.5, "b": 0.5})
    group = RubricReward(WeightedSum(parts={"quality": Gate(inner, threshold=0.5), "c": Score(name="c")},
                                     weights={"quality": 0.6, "c": 0.4}))
    r = one(group, {"a": 1.0, "b": 0.6, "c": 0.5})
    assert r.reward == pytest.approx(0.6 * 0.8 + 0.4 * 0.5)
    assert set(r.rubric) == {"quality", "quality.a", "quality.b", "c", "total"}
    assert r.rubric["quality"] == pytest.approx(0.8)


def test_each_part_is_its_own_metric_averaged_over_the_rollouts_that_evaluated_it():
    group = RubricReward(WeightedSum(parts={"grade": Score(name="grade"), "format": Format(pattern="ok")},
                                     weights={"grade": 0.5, "format": 0.5}))
    rollouts = rewarded(group, Rollout(scores={"grade": 1.0}, answer="ok"), Rollout(scores={"grade": 0.0}, answer="no"))
    assert rubric_metrics(rollouts, "train") == pytest.approx(
        {"train/rubric/grade": 0.5, "train/rubric/format": 0.5, "train/rubric/total": 0.5})


def test_a_score_the_episode_lacks_flags_no_reward_naming_it_and_flagged_rollouts_are_not_scored():
    missing = one(RubricReward(Score(name="grade")), {"correct": 1.0})
    assert (missing.reward, missing.failure) == (0.0, Failure.NO_REWARD)
    assert "no score named 'grade'" in missing.error
    flagged = Rollout(scores={"grade": 1.0})
    flagged.flag(Failure.TRUNCATED, "hit max_response_tokens")
    [r] = rewarded(RubricReward(Score()), flagged)
    assert (r.reward, r.failure, r.rubric) == (0.0, Failure.TRUNCATED, {})


def judged(outcome: dict[str, float] | None, *scores: dict[str, float] | None) -> Play:
    rollouts = [Rollout(role="solver", scores=s) for s in scores]
    rollouts[-1].holds_outcome = True
    return Play(rollouts, outcome=outcome, judged=True)


@pytest.mark.parametrize("outcome, scores", [
    ({"correct": 1.0}, [{"correct": 1.0}, {"correct": 0.0}, {"correct": 1.0}]),  # selected answer right
    ({"correct": 0.0}, [{"correct": 1.0}, {"correct": 0.0}]),  # wrong
    (None, [{"correct": 1.0}, None]),  # an early exit: incorrect
    ({"correct": 0.9}, [{"correct": 0.9}]),  # below the threshold
    ({"grade": 1.0, "speed": 1.0}, [{"correct": 1.0}]),  # an outcome it cannot score: incorrect
])
def test_asymmetric_as_a_rubric_gives_the_same_rewards_as_reward_asymmetric(outcome, scores):
    rubric = RubricReward(Score(), weight=Threshold(Score(), threshold=1.0, above=1.2, below=0.8))
    by_rubric = asyncio.run(reward_play(rubric, judged(outcome, *scores), ROW))
    by_asymmetric = apply_rewards(Asymmetric(), judged(outcome, *scores))
    facts = [[(r.score, r.weight, r.reward, r.failure) for r in rs] for rs in (by_rubric, by_asymmetric)]
    assert facts[0] == facts[1]
    assert {r.weight for r in by_rubric} == {1.2 if outcome and outcome.get("correct", 0) >= 1.0
                                              and len(outcome) == 1 else 0.8}


def test_a_weight_rubric_that_cannot_weigh_the_outcome_flags_the_play():
    group = RubricReward(Score(), weight=Score(name="correct"))
    rollouts = asyncio.run(reward_play(group, judged({"grade": 1.0}, {"correct": 1.0}), ROW))
    assert [(r.reward, r.failure) for r in rollouts] == [(0.0, Failure.NO_REWARD)]


@pytest.mark.parametrize("build, names", [
    (lambda: WeightedSum(parts={"a": Score()}, weights={"a": 0.5}), "weights sum to 0.5"),
    (lambda: WeightedSum(parts={"a": Score(), "b": Score()}, weights={"a": 1.5, "b": -0.5}), "weights.b=-0.5"),
    (lambda: WeightedSum(parts={"a": Score()}, weights={"a": float("nan")}), "weights.a=nan"),
    (lambda: WeightedSum(parts={"a": Score()}, weights={"a": 0.5, "z": 0.5}), "weights.z: no part"),
    (lambda: WeightedSum(parts={"a": Score(), "b": Score()}, weights={"a": 1.0}), "weights.b is not set"),
    (lambda: WeightedSum(parts={"a": "grade"}, weights={"a": 1.0}), "parts.a: not a rubric node"),
    (lambda: Format(pattern="(unclosed"), "pattern='(unclosed'"),
    (lambda: Threshold(Score(), above=float("inf")), "above=inf"),
    (lambda: RubricReward(WeightedSum(parts={"total": Score()}, weights={"total": 1.0})), "'total'"),
])
def test_a_bad_node_is_refused_naming_its_key(build, names):
    with pytest.raises(ValueError) as caught:
        build()
    assert names in str(caught.value)
