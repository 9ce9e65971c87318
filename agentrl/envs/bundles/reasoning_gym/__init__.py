"""`env=reasoning_gym`: reasoning-gym's procedural datasets as a bundle (see `bundle.py`)."""

from __future__ import annotations

from typing import Any

from agentrl.envs.bundles.reasoning_gym.bundle import ReasoningGymBundle


def make_bundle(**options: Any) -> ReasoningGymBundle:
    """`load_bundle("reasoning_gym", datasets=..., ...)`'s factory."""
    return ReasoningGymBundle(**options)


__all__ = ["ReasoningGymBundle", "make_bundle"]
