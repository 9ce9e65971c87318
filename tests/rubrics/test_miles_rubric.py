"""`reward=rubric` under Miles: the launch names our rubric rm hook and carries the reward config to the Ray
workers; the hook scores Miles' own `Sample`s with the rubric (a judge behind a real local HTTP endpoint), and a
judge that gives no score marks the sample failed so our group filter drops its group."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from agentrl.config.reward import AsymmetricRewardConfig, RubricRewardConfig
from agentrl.trainers.miles import rubric as miles_rubric
from agentrl.trainers.miles.args import build_launch
from agentrl.trainers.miles.hooks import FAILED_REASON, miles_drop_reason
from tests.miles.conftest import ctx, flags, make_settings
from tests.rubrics.test_judge import Endpoint

Sample = pytest.importorskip("miles.utils.types", reason="Miles is not installed").Sample


def rubric_settings(url: str) -> object:
    tree = {"_target_": "agentrl.rubrics.WeightedSum", "weights": {"grade": 0.5, "judge": 0.5},
            "parts": {"grade": {"_target_": "agentrl.rubrics.Score", "name": "grade"},
                      "judge": {"_target_": "agentrl.rubrics.Judge", "url": url, "retries": 0}}}
    return replace(make_settings(), reward=RubricRewardConfig(rubric=tree))


def test_the_launch_names_the_rubric_hook_and_carries_the_reward_config(tmp_path):
    launch = build_launch(rubric_settings("http://judge:8000"), ctx(tmp_path), model_args=[])
    assert flags(launch.argv)["--custom-rm-path"] == [miles_rubric.HOOK]
    carried = json.loads(launch.env[miles_rubric.REWARD_ENV])
    assert carried["rubric"]["parts"]["judge"]["url"] == "http://judge:8000"
    plain = build_launch(replace(make_settings(), reward=AsymmetricRewardConfig()), ctx(tmp_path), model_args=[])
    assert flags(plain.argv)["--custom-rm-path"] == ["agentrl.trainers.miles.hooks.reward_func"]
    assert miles_rubric.REWARD_ENV not in plain.env


@pytest.fixture
def endpoint(monkeypatch):
    e = Endpoint()
    settings = rubric_settings(e.url)
    monkeypatch.setenv(miles_rubric.REWARD_ENV, miles_rubric.launch_reward(settings, "x")[1][miles_rubric.REWARD_ENV])
    monkeypatch.setattr(miles_rubric, "_group", None)
    yield e
    e.close()


def sample(answer: str, grade: float) -> Sample:
    return Sample(prompt=[{"role": "user", "content": "What is 2+3?"}],
                  metadata={"agentenv_scores": {"grade": grade}, "agentenv_answer": answer, "reward": grade})


def test_the_hook_scores_miles_samples_with_the_rubric(endpoint):
    endpoint.reply = "0.8"
    samples = [sample("5", 1.0), sample("6", 0.0)]
    rewards = asyncio.run(miles_rubric.reward_func(None, samples))
    assert rewards == pytest.approx([0.9, 0.4])
    for s, r in zip(samples, rewards, strict=True):
        s.reward = r  # as Miles does with the rm hook's answer, before its group filter
    assert samples[0].metadata["agentenv_rubric"] == pytest.approx({"grade": 1.0, "judge": 0.8, "total": 0.9})
    assert "What is 2+3?" in endpoint.requests[0]["messages"][0]["content"]
    assert miles_drop_reason(samples) is None


def test_a_judge_giving_no_score_fails_the_sample_and_its_group_is_dropped(endpoint):
    endpoint.reply = "no idea"
    samples = [sample("5", 1.0), sample("6", 0.0)]
    rewards = asyncio.run(miles_rubric.reward_func(None, samples))
    assert rewards == [0.0, 0.0]
    for s, r in zip(samples, rewards, strict=True):
        s.reward = r
    assert samples[0].metadata["agentenv_failure"] == "judge_error"
    assert miles_drop_reason(samples) == FAILED_REASON
