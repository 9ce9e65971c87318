"""Playing an agent outside a trainer, for tests and scripts."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from agentrl.agents.record import Play, Rollout
from agentrl.rewards import RewardGroup, reward_play


async def rewarded(play: Awaitable[Play], reward: RewardGroup, row: dict[str, Any] | None = None) -> list[Rollout]:
    """Await an agent's play of `row` and apply the reward group to it, as the trainer's runner does."""
    return await reward_play(reward, await play, row or {})
