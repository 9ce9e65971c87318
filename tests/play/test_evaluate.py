"""Eval metrics: the mean, its error, the zero share, the breakdown a bundle declares; one printed line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.play.evaluate import eval_line, reward_metrics


def _played(score: float, **task: object) -> SimpleNamespace:
    return SimpleNamespace(score=score, row={"metadata": {"task": task}})


def test_gridsim_breaks_its_eval_down_by_battery_duration() -> None:
    played = [_played(1.0, duration_h=4), _played(0.0, duration_h=1), _played(0.5, duration_h=4), _played(0.5)]
    m = reward_metrics(played, "eval", load_bundle("gridsim").eval_breakdown)
    assert m["eval/reward"] == pytest.approx(0.5) and m["eval/zero_share"] == pytest.approx(0.25)
    assert m["eval/reward_stderr"] == pytest.approx((1 / 6) ** 0.5 / 2)
    assert (m["eval/reward_1h"], m["eval/reward_4h"]) == (0.0, 0.75)
    assert not any(k.startswith("eval/reward_2") for k in m)


def test_a_bundle_without_a_breakdown_gets_the_mean_only_and_any_bundle_may_declare_one() -> None:
    played = [_played(1.0, level=2, duration_h=4), _played(0.0, level=3, duration_h=4)]
    assert sorted(reward_metrics(played, "eval", load_bundle("arith").eval_breakdown)) == [
        "eval/reward", "eval/reward_stderr", "eval/zero_share"]
    m = reward_metrics(played, "eval_greedy", {"level": "reward_level{}"})
    assert (m["eval_greedy/reward_level2"], m["eval_greedy/reward_level3"]) == (1.0, 0.0)


def test_eval_line_reads_step_reward_error_zero_share_and_seconds() -> None:
    m = {"eval/reward": 0.8125, "eval/reward_stderr": 0.0312, "eval/zero_share": 0.05}
    assert eval_line(m, 12.34, step=10) == "step 10 eval/reward 0.812 ± 0.031, zero share 0.05, 12.3 s"
    assert eval_line({}, 1.0, prefix="eval_greedy").startswith("eval_greedy/reward nan")


def test_the_grade_is_the_envs_whatever_the_reward_group_made_of_it() -> None:
    from agentrl.agents.record import Failure, Rollout
    from agentrl.play.evaluate import play_metrics
    from agentrl.trainers.common.rollout_metrics import rollout_metrics

    # reward=rubric: the score is the rubric's total (0.9), the env graded 0.5
    rubric = Rollout(scores={"grade": 0.5}, env_reward=0.5, score=0.9, reward=0.9, tool_calls=1)
    judged_out = Rollout(scores={"grade": 1.0}, env_reward=1.0, tool_calls=2)  # the judge failed; the env had graded
    judged_out.flag(Failure.JUDGE_ERROR, "the judge timed out")
    cut = Rollout(scores={"grade": 0.75}, env_reward=0.75)  # a reply past max_response_tokens: not graded as played
    cut.flag(Failure.TRUNCATED, "cut")
    selector = Rollout(scores={"a": 0.2, "b": 0.4})  # no reward of the env's own: its scores' mean
    played = [rubric, judged_out, cut, selector]
    assert [r.grade for r in played] == pytest.approx([0.5, 1.0, 0.0, 0.3])
    m = play_metrics(played, [[r] for r in played], "eval")
    assert m["eval/grade"] == pytest.approx(1.8 / 4)
    assert m["eval/tool_call_rate"] == 0.5 and m["eval/tool_calls_per_play"] == 0.75
    assert m["eval/failure_share"] == 0.5
    assert m["eval/failure/judge_error"] == m["eval/failure/truncated"] == 0.25
    assert not any(k.startswith("eval/failure/") and k.endswith(("max_turns", "env_error")) for k in m)
    assert reward_metrics(played, "eval")["eval/reward"] == pytest.approx(0.9 / 4)  # the shaped one, apart
    assert rollout_metrics(played)["train/grade"] == pytest.approx(1.8 / 4)
    line = eval_line({**m, **reward_metrics(played, "eval")}, 2.0, step=3, subset="4 of 200 tasks")
    assert line.startswith(f"step 3 eval/reward 0.225 ± {reward_metrics(played, 'eval')['eval/reward_stderr']:.3f}, "
                           f"eval/grade 0.450 ± {m['eval/grade_stderr']:.3f} (the env's own), zero share 0.75, "
                           "tool calls in 50% of plays, failed 50% (")
    assert line.endswith("4 of 200 tasks, 2.0 s")
