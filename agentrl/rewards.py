"""The `reward` group: how an episode's named scores become the trained reward."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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


# -- Miles hooks and the group filter ---------------------------------------------------------------------
# Samples are Miles `Sample`s (attributes `reward`, `metadata`, `status`), the built-in trainer's
# `RolloutOutput`s, or plain dicts; a group may nest lists (Miles' multi-sample mode).

FAILED_REASON = "agentenv_failed"


@dataclass
class _LocalDynamicFilterOutput:
    """Same fields as Miles' `DynamicFilterOutput`, for when Miles is not installed."""

    keep: bool
    reason: str | None = None


def _dynamic_filter_output_cls() -> type:
    try:
        from miles.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:  # Miles is optional: the built-in trainer uses the same filter
        return _LocalDynamicFilterOutput
    return DynamicFilterOutput


def _flatten(samples: Any) -> list[Any]:
    if isinstance(samples, (list, tuple)):
        return [s for item in samples for s in _flatten(item)]
    return [samples]


def _get(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def sample_failed(sample: Any) -> bool:
    """True for a flagged rollout, an aborted one, or one whose agent returned no reward."""
    metadata = _get(sample, "metadata") or {}
    if metadata.get("agentenv_failure"):
        return True
    status = _get(sample, "status")
    if status is not None and str(getattr(status, "value", status)).lower() in ("aborted", "failed"):
        return True
    if isinstance(sample, dict) and "metadata" not in sample:
        return sample.get("reward") is None
    return "reward" not in metadata or _get(sample, "reward") is None


def keep_scored_groups(args: Any, samples: Any, **kwargs: Any) -> bool:
    """Dynamic sampling filter: drop a group that holds a flagged rollout or a sample without a reward.

    Use only in training; in eval nothing is filtered (a flagged rollout simply scores 0).
    """
    return not any(sample_failed(s) for s in _flatten(samples))


# Miles' rollout loop draws groups until enough are kept: when every episode fails (a dead env server, a
# refused append) it would draw forever. The filter stops it after this many drops in a row.
MAX_DROPS_ENV = "AGENTRL_MAX_DROPS_IN_A_ROW"
DEFAULT_MAX_DROPS = 1000


class AllGroupsFailing(RuntimeError):
    """Every group for too long was dropped as agentenv_failed: the rollouts cannot succeed."""


_drops = {"in_a_row": 0}
_drops_lock = threading.Lock()


def _failure_of(samples: Any) -> str:
    for s in _flatten(samples):
        metadata = _get(s, "metadata") or {}
        if metadata.get("agentenv_failure"):
            return f"{metadata['agentenv_failure']}: {metadata.get('agentenv_error') or 'no detail'}"
    return "a rollout without a reward (aborted, or the agent returned none)"


def filter_scored_groups(args: Any, samples: Any, **kwargs: Any) -> Any:
    """`keep_scored_groups` as Miles' `DynamicFilterOutput(keep, reason="agentenv_failed")`, so Miles counts
    drops under `rollout/dynamic_filter/drop_agentenv_failed`. For `--dynamic-sampling-filter-path`.

    Raises `AllGroupsFailing` once more than $AGENTRL_MAX_DROPS_IN_A_ROW (1000) groups in a row were dropped.
    """
    keep = keep_scored_groups(args, samples, **kwargs)
    limit = int(os.environ.get(MAX_DROPS_ENV) or DEFAULT_MAX_DROPS)
    with _drops_lock:
        _drops["in_a_row"] = 0 if keep else _drops["in_a_row"] + 1
        dropped = _drops["in_a_row"]
        if dropped > limit:
            _drops["in_a_row"] = 0
    if dropped > limit:
        raise AllGroupsFailing(
            f"{dropped} groups in a row were dropped as {FAILED_REASON}, the last for {_failure_of(samples)}; "
            f"no rollout is succeeding, so training cannot go on (check the env server and the agent; "
            f"trainer.max_drops_in_a_row sets the limit)")
    return _dynamic_filter_output_cls()(keep=keep, reason=None if keep else FAILED_REASON)


def _metadata_reward(sample: Any) -> float:
    metadata = _get(sample, "metadata") or {}
    if metadata.get("agentenv_failure"):
        return 0.0
    reward = metadata.get("reward")
    return 0.0 if reward is None else float(reward)


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """Miles `--custom-rm-path` hook: the reward the agent function returned (0 when flagged or missing).

    Miles awaits it with one sample (returns a float) or with a list (returns a list, one per sample).
    """
    if isinstance(samples, (list, tuple)):
        return [_metadata_reward(s) for s in samples]
    return _metadata_reward(samples)
