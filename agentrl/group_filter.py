"""The group filter: which groups a training step keeps, and the streak that stops a run whose groups all fail.

A group is dropped when it holds a flagged rollout (`FAILED`) or when all its rewards are equal (`NO_SIGNAL`:
zero advantage, nothing to learn). The built-in GRPO step and the TRL backend apply `group_drop_reason`; Miles'
hooks (`trainers/miles/hooks.py`) apply `drop_reason` to its samples. Eval drops nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.agents.record import MODEL_FAILURES, Rollout

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
