"""The reward group (`agentrl.rewards.apply_rewards`): each rollout's score (step 1, unweighted) apart from its
trained reward (score x the judged play's weight), a flagged rollout at 0, and a score the group cannot use
flagged `no_reward`. Real `Rollout`/`Play` records, as agents return them."""

from __future__ import annotations

import pytest

from agentrl.agents.record import Failure, Play, Rollout
from agentrl.rewards import Asymmetric, EnvScore, MeanScores, apply_rewards

WEIGHTS = Asymmetric(correct_weight=1.5, incorrect_weight=0.5)


def judged_play(outcome: dict[str, float] | None, *scores: dict[str, float] | None) -> Play:
    """A co-evolution-shaped play: a rollout per score (None: unscored), the last one holding the outcome."""
    rollouts = [Rollout(role="solver", scores=s) for s in scores]
    rollouts[-1].holds_outcome = True
    return Play(rollouts, outcome=outcome, judged=True)


def facts(rollouts: list[Rollout]) -> list[tuple[float, float, float, bool]]:
    return [(r.score, r.weight, r.reward, r.judged) for r in rollouts]


def test_a_judged_play_whose_selected_answer_is_right_trains_on_score_times_the_correct_weight():
    play = judged_play({"correct": 1.0}, {"correct": 1.0}, {"correct": 0.0}, {"correct": 1.0})
    assert facts(apply_rewards(WEIGHTS, play)) == [(1.0, 1.5, 1.5, True), (0.0, 1.5, 0.0, True),
                                                  (1.0, 1.5, 1.5, True)]


def test_a_judged_play_whose_selected_answer_is_wrong_keeps_each_score_and_weights_the_reward_down():
    play = judged_play({"correct": 0.0}, {"correct": 1.0}, {"correct": 0.0})
    rollouts = apply_rewards(WEIGHTS, play)
    assert facts(rollouts) == [(1.0, 0.5, 0.5, True), (0.0, 0.5, 0.0, True)]
    assert all(r.failure is None for r in rollouts)


def test_an_early_exit_counts_as_incorrect_and_its_unscored_rollouts_score_0():
    play = judged_play(None, {"correct": 1.0}, None)
    play.rollouts[1].early_exit = True
    assert facts(apply_rewards(WEIGHTS, play)) == [(1.0, 0.5, 0.5, True), (0.0, 0.5, 0.0, True)]


def test_an_outcome_the_group_cannot_score_counts_as_incorrect():
    play = judged_play({"grade": 1.0, "speed": 1.0}, {"correct": 1.0})  # EnvScore needs exactly one score
    assert facts(apply_rewards(WEIGHTS, play)) == [(1.0, 0.5, 0.5, True)]


def test_a_play_that_is_not_judged_trains_on_its_score_unweighted():
    rollouts = apply_rewards(WEIGHTS, Play([Rollout(scores={"correct": 1.0}), Rollout(scores={"correct": 0.0})]))
    assert facts(rollouts) == [(1.0, 1.0, 1.0, False), (0.0, 1.0, 0.0, False)]
    [partial] = apply_rewards(MeanScores(), Play([Rollout(scores={"a": 1.0, "b": 0.5})]))
    assert (partial.score, partial.reward) == (0.75, 0.75)


def test_a_flagged_rollout_scores_0_and_trains_on_0_whatever_it_scored():
    flagged = Rollout(scores={"correct": 1.0})
    flagged.flag(Failure.TRUNCATED, "the model's reply hit max_response_tokens")
    play = judged_play({"correct": 1.0}, {"correct": 1.0})
    play.rollouts.insert(0, flagged)
    rollouts = apply_rewards(WEIGHTS, play)
    assert facts(rollouts) == [(0.0, 1.5, 0.0, True), (1.0, 1.5, 1.5, True)]
    assert rollouts[0].failure == Failure.TRUNCATED  # the first failure stays


@pytest.mark.parametrize("group, scores, named", [
    (EnvScore(score="grade"), {"correct": 1.0}, "no score named 'grade'"),
    (EnvScore(), {"grade": 1.0, "speed": 0.5}, "needs exactly one score"),
    (MeanScores(scores=["a", "b"]), {"a": 1.0}, "missing scores ['b']"),
])
def test_scores_the_group_cannot_use_flag_no_reward_naming_what_it_wanted(group, scores, named):
    [rollout] = apply_rewards(group, Play([Rollout(scores=scores)]))
    assert (rollout.score, rollout.reward, rollout.failure) == (0.0, 0.0, Failure.NO_REWARD)
    assert named in rollout.error


def test_a_group_that_cannot_score_a_judged_play_flags_every_rollout():
    play = judged_play({"correct": 1.0}, {"correct": 1.0}, {"correct": 1.0})
    rollouts = apply_rewards(EnvScore(score="grade"), play)
    assert all(r.failure == Failure.NO_REWARD and (r.score, r.reward) == (0.0, 0.0) for r in rollouts)
