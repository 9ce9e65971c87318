"""The `reward` group: how a play's scores become the trained rewards, in two steps.

1. **Episode reward**: each rollout's named scores -> one number (`EnvScore`, `MeanScores`, `Asymmetric`); a
   flagged rollout, or one that scored nothing (an early exit), gets 0.
2. **Group weighting**: for patterns that end in one judged answer (co-evolution's selector), every rollout of
   the play is multiplied by the group's weight for that outcome (`Asymmetric`: 1.2 when correct, 0.8 otherwise).

`apply_rewards` runs both; agents only report scores and roles. Which groups a step keeps is
`agentrl.group_filter`. Nothing here knows Miles: its hooks live in `agentrl.trainers.miles_hooks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.agents.record import Failure, Play, Rollout


class RewardError(ValueError):
    """The scores do not hold what the reward weighting needs."""


class RewardGroup:
    """Scores -> an episode's reward (`__call__`), and the weight of a judged play's outcome (`weight`)."""

    def __call__(self, scores: dict[str, float]) -> float:
        raise NotImplementedError

    def weight(self, outcome_reward: float | None) -> float:
        """The factor for every rollout of a judged play whose outcome earned `outcome_reward` (None: no
        outcome, an early exit). 1.0 unless the group weights outcomes."""
        return 1.0


@dataclass
class EnvScore(RewardGroup):
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
class MeanScores(RewardGroup):
    """The mean of the named scores (all of them when `scores` is null)."""

    scores: Sequence[str] | None = None

    def __call__(self, scores: dict[str, float]) -> float:
        names = list(self.scores) if self.scores is not None else sorted(scores)
        missing = [n for n in names if n not in scores]
        if missing or not names:
            raise RewardError(f"missing scores {missing or 'all'}; the episode scored {sorted(scores)}")
        return sum(float(scores[n]) for n in names) / len(names)


@dataclass
class Asymmetric(RewardGroup):
    """Co-evolution weighting: a play's rewards x correct_weight when its selected answer is right, else x
    incorrect_weight (early exits count as incorrect). Per-episode reward is the env's one score."""

    correct_weight: float = 1.2
    incorrect_weight: float = 0.8
    correct_threshold: float = 1.0

    def __call__(self, scores: dict[str, float]) -> float:
        return EnvScore()(scores)

    def weight(self, outcome_reward: float | None) -> float:
        if outcome_reward is not None and outcome_reward >= self.correct_threshold:
            return self.correct_weight
        return self.incorrect_weight


def episode_reward(group: RewardGroup, rollout: Rollout) -> float:
    """Step 1 for one rollout: 0 when flagged or unscored; a score the group cannot use flags `no_reward`."""
    if rollout.failure is not None or rollout.scores is None:
        return 0.0
    try:
        return float(group(rollout.scores))
    except Exception as exc:  # noqa: BLE001 - the group's own error names the score it wanted
        rollout.flag(Failure.NO_REWARD, f"{type(exc).__name__}: {exc}")
        return 0.0


def apply_rewards(group: RewardGroup, play: Play) -> list[Rollout]:
    """Both steps for a play: sets every rollout's `reward` (and `weight`); returns the rollouts."""
    for rollout in play.rollouts:
        rollout.reward = episode_reward(group, rollout)
    if play.judged:
        outcome = None
        if play.outcome is not None:
            try:
                outcome = float(group(play.outcome))
            except Exception:  # noqa: BLE001 - an outcome the group cannot score counts as incorrect
                outcome = None
        weight = float(group.weight(outcome))
        for rollout in play.rollouts:
            rollout.weight = weight
            rollout.reward *= weight
    return play.rollouts
