"""Playing an agent outside a trainer, for tests and scripts."""

from __future__ import annotations

from collections.abc import Awaitable

from agentrl.agents.record import Play, Rollout
from agentrl.rewards import RewardGroup, apply_rewards


async def rewarded(play: Awaitable[Play], reward: RewardGroup) -> list[Rollout]:
    """Await an agent's play and apply the reward group to it, as the trainer's runner does."""
    return apply_rewards(reward, await play)
