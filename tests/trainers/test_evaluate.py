"""Eval metrics: the mean, its error, the zero share, the breakdown a bundle declares; one printed line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.trainers.evaluate import eval_line, reward_metrics


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
