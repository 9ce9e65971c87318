"""The `reward` group: how a play's scores become the trained rewards, in two steps.

1. **Episode score**: each rollout's named scores -> one number, its `score` (`EnvScore`, `MeanScores`,
   `Asymmetric`); a flagged rollout, or one that scored nothing (an early exit), gets 0.
2. **Group weighting**: for patterns that end in one judged answer (co-evolution's selector), every rollout of
   the play gets the group's weight for that outcome (`Asymmetric`: x `correct_weight` when correct, else x
   `incorrect_weight`). The trained `reward` is score x weight; eval reads the score.

`apply_rewards` runs both; `reward_play` first lets the group make the calls it needs (an LLM judge's: `reward=rubric`,
`agentrl.rubrics`). Agents only report scores and roles. Which groups a step keeps is
`agentrl.group_filter`. Nothing here knows Miles: its hooks live in `agentrl.trainers.miles.hooks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.agents.record import Failure, Play, Rollout
from agentrl.config.reward import AsymmetricRewardConfig


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

    def score_rollout(self, rollout: Rollout) -> float:
        """Step 1 for an unflagged, scored rollout (a group that reads more than the scores overrides it)."""
        return self(rollout.scores or {})

    def play_weight(self, play: Play) -> float:
        """Step 2 for a judged play: `weight` of the group's score of its outcome (an outcome it cannot score
        counts as none)."""
        outcome = None
        if play.outcome is not None:
            try:
                outcome = float(self(play.outcome))
            except Exception:  # noqa: BLE001 - an outcome the group cannot score counts as incorrect
                outcome = None
        return float(self.weight(outcome))

    async def prepare(self, play: Play, row: Mapping[str, Any]) -> None:
        """What a play's rewards need from outside before they are applied (an LLM judge's calls); it flags a
        rollout it cannot score. Nothing by default."""

    def metrics(self) -> dict[str, float]:
        """The group's own counters, logged each step beside the trainer's (an LLM judge's). {} by default."""
        return {}


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

    # The schema's defaults (one home: agentrl/config/reward.py), for an Asymmetric made without a config.
    correct_weight: float = AsymmetricRewardConfig.correct_weight
    incorrect_weight: float = AsymmetricRewardConfig.incorrect_weight
    correct_threshold: float = AsymmetricRewardConfig.correct_threshold

    def __call__(self, scores: dict[str, float]) -> float:
        return EnvScore()(scores)

    def weight(self, outcome_reward: float | None) -> float:
        if outcome_reward is not None and outcome_reward >= self.correct_threshold:
            return self.correct_weight
        return self.incorrect_weight


def episode_score(group: RewardGroup, rollout: Rollout) -> float:
    """Step 1 for one rollout: 0 when flagged or unscored; a score the group cannot use flags `no_reward`."""
    if rollout.failure is not None or rollout.scores is None:
        return 0.0
    try:
        return float(group.score_rollout(rollout))
    except Exception as exc:  # noqa: BLE001 - the group's own error names the score it wanted
        rollout.flag(Failure.NO_REWARD, f"{type(exc).__name__}: {exc}")
        return 0.0


def outcome_weight(group: RewardGroup, play: Play) -> float:
    """Step 2: the factor for every rollout of `play`: the group's weight for a judged play's outcome, else 1."""
    return group.play_weight(play) if play.judged else 1.0


def apply_rewards(group: RewardGroup, play: Play) -> list[Rollout]:
    """Both steps for a play: sets every rollout's `score`, `weight`, trained `reward` (score x weight, 0 when
    flagged) and `judged`; returns the rollouts."""
    weight = outcome_weight(group, play)
    for rollout in play.rollouts:
        rollout.score = episode_score(group, rollout)
        rollout.weight, rollout.judged = weight, play.judged
        rollout.reward = rollout.score * weight
    return play.rollouts


async def reward_play(group: RewardGroup, play: Play, row: Mapping[str, Any]) -> list[Rollout]:
    """`apply_rewards` after the group's own calls for the play (`prepare`: an LLM judge's): what a trainer's
    runner calls once a play of `row` ended."""
    await group.prepare(play, row)
    return apply_rewards(group, play)


def rubric_metrics(rollouts: Sequence[Rollout], prefix: str) -> dict[str, float]:
    """`<prefix>/rubric/<part>`: each rubric part's mean over the rollouts that evaluated it (`reward=rubric`
    records them in `Rollout.rubric`; `total` is the whole rubric). {} under other groups."""
    values: dict[str, list[float]] = {}
    for r in rollouts:
        for name, value in r.rubric.items():
            values.setdefault(name, []).append(value)
    return {f"{prefix}/rubric/{name}": sum(vs) / len(vs) for name, vs in sorted(values.items())}
