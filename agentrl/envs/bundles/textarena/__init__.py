"""`env=textarena`: TextArena's games as a bundle of seeded matches (see `bundle.py`)."""

from __future__ import annotations

from typing import Any

from agentrl.envs.bundles.textarena.bundle import TextArenaBundle


def make_bundle(**options: Any) -> TextArenaBundle:
    """`load_bundle("textarena", game=..., ...)`'s factory."""
    return TextArenaBundle(**options)


__all__ = ["TextArenaBundle", "make_bundle"]
