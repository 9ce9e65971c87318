"""The `reward` group: how a play's scores become the trained rewards, in two steps.

1. **Episode reward**: each rollout's named scores -> one number (`EnvScore`, `MeanScores`, `Asymmetric`); a
   flagged rollout, or one that scored nothing (an early exit), gets 0.
2. **Group weighting**: for patterns that end in one judged answer (co-evolution's selector), every rollout of
   the play is multiplied by the group's weight for that outcome (`Asymmetric`: 1.2 when correct, 0.8 otherwise).

`apply_rewards` runs both; agents only report scores and roles. Nothing here knows Miles: its hooks live in
`agentrl.trainers.miles_hooks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.agents.record import MODEL_FAILURES, Failure, Play, Rollout


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


# -- The group filter: which groups a training step keeps ------------------------------------------------

FAILED = "failed"  # the group holds a flagged rollout (or, under Miles, one without a reward)
NO_SIGNAL = "no_signal"  # every reward in the group is equal: zero advantage, nothing to learn


def drop_reason(rewards: Sequence[float | None], failed: Sequence[bool], *, drop_no_signal: bool = True
                ) -> str | None:
    """Why a group is dropped from training (`FAILED`, `NO_SIGNAL`), or None to keep it. Eval drops nothing."""
    if any(failed) or any(r is None for r in rewards):
        return FAILED
    if drop_no_signal and len(set(rewards)) <= 1:
        return NO_SIGNAL
    return None


def group_drop_reason(group: Sequence[Rollout], *, drop_no_signal: bool = True,
                      penalize_model_failures: bool = False) -> str | None:
    """`drop_reason` for a group of the built-in trainer's rollouts. With `penalize_model_failures`, a rollout
    flagged for the policy's own doing (`MODEL_FAILURES`: truncated, over budget, out of turns) stays in its
    group at reward 0 instead of dropping it; failures of the env, the sandbox or the engine still drop it."""
    return drop_reason([r.reward for r in group],
                       [r.failure is not None and not (penalize_model_failures and r.failure in MODEL_FAILURES)
                        for r in group], drop_no_signal=drop_no_signal)


class AllGroupsFailing(RuntimeError):
    """Every group for too long was dropped as failed: the rollouts cannot succeed (a dead env server, ...)."""


class FailureStreak:
    """Counts groups dropped in a row; raises `AllGroupsFailing` past `limit`, naming the last cause.

    Groups dropped for no signal count only with `count_no_signal` (Miles, whose loop draws until enough groups
    are kept, would otherwise draw forever); the built-in trainer bounds each step's draws itself.
    """

    def __init__(self, limit: int, label: str = FAILED, *, count_no_signal: bool = False) -> None:
        self.limit, self.in_a_row, self.label = int(limit), 0, label  # label: how the drop reason is named
        self.count_no_signal = count_no_signal

    def record(self, reason: str | None, cause: str = "") -> None:
        if reason == NO_SIGNAL and not self.count_no_signal:
            return
        self.in_a_row = self.in_a_row + 1 if reason is not None else 0
        if self.in_a_row > self.limit:
            dropped, self.in_a_row = self.in_a_row, 0
            why = ("no rollout is succeeding, so training cannot go on (check the env server and the agent"
                   if reason == FAILED else "no group has a reward signal, so there is nothing to learn (rewards "
                   "all equal: the task is too easy or too hard for the model")
            raise AllGroupsFailing(
                f"{dropped} groups in a row were dropped as {self.label if reason == FAILED else reason}, the last "
                f"for {cause or 'an unknown cause'}; {why}; trainer.max_drops_in_a_row sets the limit)")


def failure_cause(group: Sequence[Rollout]) -> str:
    """`<failure>: <error>` of the group's first flagged rollout."""
    for r in group:
        if r.failure is not None:
            return f"{r.failure.value}: {r.error or 'no detail'}"
    return "a rollout without a reward"
