"""`env=openenv`: an OpenEnv server someone else wrote, played as a bundle (see `bundle.py`)."""

from __future__ import annotations

from typing import Any

from agentrl.envs.bundles.openenv_remote.bundle import OpenEnvBundle


def make_bundle(**options: Any) -> OpenEnvBundle:
    """`load_bundle("openenv", url=..., ...)`'s factory."""
    return OpenEnvBundle(**options)


__all__ = ["OpenEnvBundle", "make_bundle"]
