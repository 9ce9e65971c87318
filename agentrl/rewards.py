"""The `reward` group: how an episode's named scores become the trained reward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class RewardError(ValueError):
    """The scores do not hold what the reward weighting needs."""


@dataclass
class EnvScore:
    """The episode's one score, or the score named `score`."""

    score: str | None = None

    def __call__(self, scores: dict[str, float]) -> float:
        if self.score is not None:
            if self.score not in scores:
                raise RewardError(f"no score named {self.score!r}; the episode scored {sorted(scores)}")
            return float(scores[self.score])
        if len(scores) != 1:
            raise RewardError(
                f"reward=env_score needs exactly one score, got {sorted(scores)}; set reward.score=<name>"
            )
        return float(next(iter(scores.values())))


@dataclass
class MeanScores:
    """The mean of the named scores (all of them when `scores` is null)."""

    scores: Sequence[str] | None = None

    def __call__(self, scores: dict[str, float]) -> float:
        names = list(self.scores) if self.scores is not None else sorted(scores)
        missing = [n for n in names if n not in scores]
        if missing or not names:
            raise RewardError(f"missing scores {missing or 'all'}; the episode scored {sorted(scores)}")
        return sum(float(scores[n]) for n in names) / len(names)


@dataclass
class Asymmetric:
    """Co-evolution weighting: a group's rewards x correct_weight when its selected answer is right, else x
    incorrect_weight (early exits count as incorrect). Per-episode reward is the env's one score."""

    correct_weight: float = 1.2
    incorrect_weight: float = 0.8
    correct_threshold: float = 1.0

    def __call__(self, scores: dict[str, float]) -> float:
        return EnvScore()(scores)

    def weight(self, selected_reward: float | None) -> float:
        """The factor for every sample of a group whose selector picked a reward of `selected_reward`."""
        if selected_reward is not None and selected_reward >= self.correct_threshold:
            return self.correct_weight
        return self.incorrect_weight
