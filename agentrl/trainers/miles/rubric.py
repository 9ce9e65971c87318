"""`reward=rubric` under Miles: its `--custom-rm-path` hook scores each sample with the run's rubric (the task's
prompt, the agent's answer, the env's named scores), the LLM judge's calls included, in the Ray worker that
calls it. The reward config reaches the worker as JSON in $AGENTRL_REWARD; a judge that gives no score marks
the sample failed (`agentenv_failure=judge_error`), so our group filter drops its group as under `trainer=grpo`.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from agentrl.agents.record import Play, miles_rollout, miles_rubric_metadata
from agentrl.rewards import RewardGroup, episode_score

if TYPE_CHECKING:
    from agentrl.config.schema import RunConfig

REWARD_ENV = "AGENTRL_REWARD"  # the run's `reward` config (JSON) for the hook to build in a Ray worker
HOOK = "agentrl.trainers.miles.rubric.reward_func"

_group: RewardGroup | None = None


def reward_group() -> RewardGroup:
    """The run's reward group, built once per worker from $AGENTRL_REWARD."""
    global _group
    if _group is None:
        from hydra.utils import instantiate

        text = os.environ.get(REWARD_ENV)
        if not text:
            raise RuntimeError(f"${REWARD_ENV} is unset: the Miles launch sets it under reward=rubric")
        _group = instantiate(json.loads(text))
    return _group


def _prompt_row(sample: Any) -> dict[str, Any]:
    prompt = sample.get("prompt") if isinstance(sample, dict) else getattr(sample, "prompt", "")
    if isinstance(prompt, list):
        return {"messages": prompt}
    return {"messages": [{"role": "user", "content": str(prompt or "")}]}


async def score_sample(group: RewardGroup, sample: Any) -> float:
    """The rubric's reward for one Miles sample (0 when the agent flagged it or nothing was scored); merges
    `miles_rubric_metadata` (the reward, each part, a failed rubric's failure) into its metadata."""
    metadata = (sample.get("metadata") if isinstance(sample, dict) else getattr(sample, "metadata", None)) or {}
    rollout = miles_rollout(metadata)
    if rollout.failure is not None or rollout.scores is None:
        return 0.0
    await group.prepare(Play([rollout]), _prompt_row(sample))
    reward = episode_score(group, rollout)
    metadata.update(miles_rubric_metadata(rollout, reward))
    if isinstance(sample, dict):
        sample["metadata"] = metadata
    else:
        sample.metadata = metadata
    return reward


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """Miles `--custom-rm-path` under reward=rubric: one sample -> a float, a list -> a list."""
    group = reward_group()
    if isinstance(samples, (list, tuple)):
        return [await score_sample(group, s) for s in samples]
    return await score_sample(group, samples)


def uses_rubric(settings: RunConfig) -> bool:
    """True under reward=rubric (the typed `reward` settings name RubricReward)."""
    return str(settings.reward._target_) == "agentrl.rubrics.RubricReward"


def launch_reward(settings: RunConfig, hook: str) -> tuple[str, dict[str, str]]:
    """(--custom-rm-path, environment) for the run: under reward=rubric this module's hook (unless trainer.
    reward_hook names one of the user's own) and the reward config as JSON; else `hook` as it is."""
    import dataclasses

    from agentrl.config.trainer import MilesTrainerConfig

    if not uses_rubric(settings):
        return hook, {}
    reward: Any = settings.reward  # the typed schema (a dataclass); a mapping (a DictConfig) is taken as is
    is_schema = dataclasses.is_dataclass(reward) and not isinstance(reward, type)
    node = dataclasses.asdict(reward) if is_schema else dict(reward)
    return (HOOK if hook == MilesTrainerConfig.reward_hook else hook), {REWARD_ENV: json.dumps(node)}


def env_server_reward(plan: Any) -> Any:
    """The reward the env server sends under Miles: the run's reward group, except under reward=rubric, whose
    rubric this module's rm hook applies to the sample (it needs the answer and may await a judge); the env
    server then sends a placeholder 0, never trained on."""
    return (lambda scores: 0.0) if uses_rubric(plan.settings) else plan.reward
