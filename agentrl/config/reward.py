"""Schemas of the `reward` group: how an episode's named scores become the trained reward."""

from __future__ import annotations

from dataclasses import dataclass


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
