"""Schemas of the `reward` group: how an episode's named scores become the trained reward."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agentrl.config.numbers import check_finite


@dataclass
class RewardConfig:
    _target_: str = "agentrl.rewards.EnvScore"


@dataclass
class EnvScoreRewardConfig(RewardConfig):
    _target_: str = "agentrl.rewards.EnvScore"
    # null: the episode's only score; else the name of the score to use.
    score: str | None = None


@dataclass
class MeanScoresRewardConfig(RewardConfig):
    _target_: str = "agentrl.rewards.MeanScores"
    # null: the mean of every named score; else the mean of these names.
    scores: list[str] | None = None


@dataclass
class AsymmetricRewardConfig(RewardConfig):
    _target_: str = "agentrl.rewards.Asymmetric"
    correct_weight: float = 1.2  # x reward of every sample when the group's selected answer is correct
    incorrect_weight: float = 0.8  # x reward otherwise, early exits included
    correct_threshold: float = 1.0  # a selected reward at or above this counts as correct

    def __post_init__(self) -> None:
        check_finite("reward", self, ("correct_weight", "incorrect_weight"))
        if not math.isfinite(self.correct_threshold):
            raise ValueError(f"reward.correct_threshold must be a finite number, got {self.correct_threshold!r}")


@dataclass
class JudgeConfig:
    """The defaults of an LLM judge (`agentrl.rubrics.Judge`), a node of a `reward=rubric` tree."""

    # The OpenAI-compatible endpoint's base URL: `{url}/v1/chat/completions` (a vLLM server, any OpenAI API); with
    # session_server, an agentrl session server (`python -m agentrl.inference.serve`): a session per call.
    url: str
    session_server: bool = False
    model: str | None = None  # the request's `model` (null: the endpoint's own default)
    # {prompt} is the task's prompt and {answer} the rollout's answer; the reply must hold a number in [0, 1].
    prompt: str = ("Task:\n{prompt}\n\nAnswer:\n{answer}\n\nRate the answer from 0 (wrong) to 1 (right). "
                   "Reply with the number only.")
    score_pattern: str = r"(\d+(?:\.\d+)?)"  # the reply's first match is the score (its first group if any)
    max_tokens: int = 16
    temperature: float = 0.0
    timeout_s: float = 30.0  # per attempt
    retries: int = 2  # more attempts after a timeout, an error or a reply without a score
    batch_size: int = 8  # judge requests in flight at once (the endpoint batches them)
    cache: bool = True  # a (prompt, answer) already judged is not asked again


@dataclass
class RubricRewardConfig(RewardConfig):
    """`reward=rubric`: OpenEnv rubrics built from `_target_` nodes (`agentrl.rubrics`)."""

    _target_: str = "agentrl.rubrics.RubricReward"
    # The episode's score: a tree of rubric nodes (Score, Format, WeightedSum, Gate, Sequential, Threshold, Judge).
    # null: the episode's one score (a Score node), as reward=env_score.
    rubric: Any = None
    # Judged plays (co-evolution): the factor every rollout of the play gets, a rubric of the play's outcome
    # (null: 1). reward=asymmetric is a Threshold over the Score, above 1.2, below 0.8.
    weight: Any = None


# The nodes of a reward=rubric tree (`agentrl.rubrics`): their schemas, the one home of their defaults. The tree
# is held untyped (`RubricRewardConfig.rubric: Any`); the plan checks each node's keys against its class.


@dataclass
class ScoreNodeConfig:
    _target_: str = "agentrl.rubrics.Score"
    name: str | None = None  # null: the episode's one score


@dataclass
class FormatNodeConfig:
    _target_: str = "agentrl.rubrics.Format"
    full: bool = False  # the pattern must match the whole answer (else anywhere in it)


@dataclass
class GateNodeConfig:
    _target_: str = "agentrl.rubrics.Gate"
    threshold: float = 1.0  # OpenEnv's Gate: the child's score at or above this, else 0


@dataclass
class ThresholdNodeConfig:
    _target_: str = "agentrl.rubrics.Threshold"
    threshold: float = 1.0
    above: float = 1.0  # the value when the child reaches the threshold
    below: float = 0.0  # else (and when the child's score is missing)
