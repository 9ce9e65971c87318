"""The Miles metadata keys (`agentenv_*`) have one home, `agentrl.agents.record`: what the agent function writes
reads back as the same record, and the rubric hook's additions are written there too."""

from __future__ import annotations

from agentrl.agents.record import Failure, Rollout, miles_metadata, miles_rollout, miles_rubric_metadata


def test_a_rollouts_miles_metadata_reads_back_as_its_record():
    played = Rollout(scores={"grade": 0.75}, answer="42", tool_calls=3, invalid_calls=1, turns=4,
                     completion_tokens=120, context_tokens=900, reward=0.75)
    back = miles_rollout(miles_metadata(played))
    assert (back.scores, back.answer, back.tool_calls, back.invalid_calls, back.turns, back.completion_tokens,
            back.context_tokens, back.failure) == ({"grade": 0.75}, "42", 3, 1, 4, 120, 900, None)
    played.flag(Failure.TOOL_TIMEOUT, "the tool took too long")
    back = miles_rollout(miles_metadata(played))
    assert (back.failure, back.error) == (Failure.TOOL_TIMEOUT, "the tool took too long")
    assert miles_rollout({}).scores is None  # nothing scored: the rubric hook scores 0


def test_the_rubric_hooks_additions():
    judged = Rollout(rubric={"grade": 1.0, "total": 0.9})
    assert miles_rubric_metadata(judged, 0.9) == {"reward": 0.9, "agentenv_rubric": {"grade": 1.0, "total": 0.9}}
    judged.flag(Failure.JUDGE_ERROR, "the judge gave no score")
    assert miles_rubric_metadata(judged, 0.0)["agentenv_failure"] == "judge_error"
