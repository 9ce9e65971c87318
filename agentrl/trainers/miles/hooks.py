"""The functions Miles calls by path: the agent function wrapper, the generate wrapper, the reward hook and the
group filter. Everything here reads and writes Miles' own shapes (its `Sample`s, metadata dicts with the AgentEnv
key names); the rules they apply live in `agentrl.rewards`, `agentrl.group_filter` and the agents.

Miles' samples are `Sample`s (attributes `reward`, `metadata`, `status`) or plain dicts; a group may nest lists
(Miles' multi-sample mode). The settings the filter needs reach Ray workers as environment variables.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any

from agentrl.agents.record import ERROR_KEY, FAILURE_KEY, Failure, metadata_failure
from agentrl.group_filter import FAILED, FailureStreak, drop_reason

FAILED_REASON = "agentenv_failed"  # Miles counts it as rollout/dynamic_filter/drop_agentenv_failed
MAX_DROPS_ENV = "AGENTRL_MAX_DROPS_IN_A_ROW"
DEFAULT_MAX_DROPS = 1000
DROP_NO_SIGNAL_ENV = "AGENTRL_DROP_NO_SIGNAL"  # "0" keeps groups whose rewards are all equal
AGENT_FUNCTION_ENV = "AGENTRL_AGENT_FUNCTION"  # the agent function `agent_function` plays
DEFAULT_AGENT_FUNCTION = "agentrl.agents.tool_calling.run"
MILES_GENERATE = "miles.rollout.generate_hub.agentic_tool_call.generate"


@dataclass
class _LocalDynamicFilterOutput:
    """Same fields as Miles' `DynamicFilterOutput`, for when Miles is not installed."""

    keep: bool
    reason: str | None = None


def _dynamic_filter_output_cls() -> type:
    try:
        from miles.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:  # Miles is optional: the tests run the filter without it
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
    if metadata.get(FAILURE_KEY):
        return True
    status = _get(sample, "status")
    if status is not None and str(getattr(status, "value", status)).lower() in ("aborted", "failed"):
        return True
    if isinstance(sample, dict) and "metadata" not in sample:
        return sample.get("reward") is None
    return "reward" not in metadata or _get(sample, "reward") is None


def _reward(sample: Any) -> float | None:
    reward = _get(sample, "reward")
    if reward is None:
        reward = (_get(sample, "metadata") or {}).get("reward")
    return None if reward is None else float(reward)


def miles_drop_reason(samples: Any) -> str | None:
    """`agentrl.group_filter.drop_reason` for a Miles group, named as Miles counts it (`agentenv_failed`,
    `no_signal`); no-signal drops follow $AGENTRL_DROP_NO_SIGNAL (default on, as in the built-in trainer)."""
    flat = _flatten(samples)
    reason = drop_reason([_reward(s) for s in flat], [sample_failed(s) for s in flat],
                         drop_no_signal=os.environ.get(DROP_NO_SIGNAL_ENV, "1") != "0")
    return FAILED_REASON if reason == FAILED else reason


def keep_scored_groups(args: Any, samples: Any, **kwargs: Any) -> bool:
    """True when the group holds no flagged rollout and no sample without a reward (signal not checked)."""
    return not any(sample_failed(s) for s in _flatten(samples))


def _failure_of(samples: Any) -> str:
    for s in _flatten(samples):
        if failure := metadata_failure(_get(s, "metadata") or {}):
            return failure
    return "a rollout without a reward (aborted, or the agent returned none)"


_streak = FailureStreak(DEFAULT_MAX_DROPS, FAILED_REASON, count_no_signal=True)
_streak_lock = threading.Lock()


def filter_scored_groups(args: Any, samples: Any, **kwargs: Any) -> Any:
    """Miles' `--dynamic-sampling-filter-path`: `DynamicFilterOutput(keep, reason)`, the reason being
    `agentenv_failed` or `no_signal`, so Miles counts each under `rollout/dynamic_filter/drop_<reason>`.

    Raises `AllGroupsFailing` once more than $AGENTRL_MAX_DROPS_IN_A_ROW (1000) groups in a row were dropped.
    """
    reason = miles_drop_reason(samples)
    with _streak_lock:
        _streak.limit = int(os.environ.get(MAX_DROPS_ENV) or DEFAULT_MAX_DROPS)
        _streak.record(FAILED if reason == FAILED_REASON else reason,
                       _failure_of(samples) if reason == FAILED_REASON else "all rewards equal")
    return _dynamic_filter_output_cls()(keep=reason is None, reason=reason)


def _metadata_reward(sample: Any) -> float:
    metadata = _get(sample, "metadata") or {}
    if metadata.get(FAILURE_KEY):
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


# -- A rollout that fails before the model's first call ------------------------------------------------------
# Miles' agentic generate then returns the input sample ABORTED, dropping what the agent function returned and
# never calling the reward hook; eval, which filters nothing, sums its None reward and crashes. The wrappers
# below keep the agent's result (per rollout, in a context variable) and give such a sample reward 0 with it.

_agent_result: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("agentrl_agent_result",
                                                                                     default=None)


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


async def agent_function(base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any],
                         **kwargs: Any) -> dict[str, Any] | None:
    """`--custom-agent-function-path`: plays $AGENTRL_AGENT_FUNCTION (the tool-calling agent by default) and
    keeps its result for `generate`."""
    agent = _load(os.environ.get(AGENT_FUNCTION_ENV) or DEFAULT_AGENT_FUNCTION)
    result = await agent(base_url=base_url, prompt=prompt, request_kwargs=request_kwargs, metadata=metadata,
                         **kwargs)
    holder = _agent_result.get()
    if holder is not None:
        holder.update(result or {})
    return result


async def generate(input: Any) -> Any:
    """`--custom-generate-function-path`: Miles' agentic generate, whose samples always carry a reward (0 with
    the agent's failure when nothing was recorded)."""
    holder: dict[str, Any] = {}
    token = _agent_result.set(holder)
    try:
        output = await _load(MILES_GENERATE)(input)
    finally:
        _agent_result.reset(token)
    for sample in _flatten(output.samples):
        status = getattr(sample, "status", None)
        if getattr(sample, "reward", None) is None and "aborted" in str(getattr(status, "value", status)).lower():
            sample.metadata = {**(sample.metadata or {}), **holder, "reward": 0.0}
            sample.metadata.setdefault(FAILURE_KEY, Failure.NO_MODEL_TURN.value)
            sample.metadata.setdefault(ERROR_KEY, "the rollout ended before the model's first call")
            sample.reward = 0.0
    return output

