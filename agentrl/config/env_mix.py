"""Schema of `env=mix`: several bundles in one run, each row drawn from one of them by weight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.config.env import EnvConfig


@dataclass
class MixEnvConfig(EnvConfig):
    """Weighted bundles served as one: `env.bundles={gridsim:0.7,reasoning_gym:0.3}` (docs/environments.md)."""

    bundle: str = "mix"
    # Required. Group name -> its weight (the name is an env option: gridsim, reasoning_gym, openenv, ...), or
    # name -> {weight, env (the option; default the name), demonstrations (its warm-start teacher), and that
    # option's own keys}, or a list of such groups, each with a `name`. Untyped so a CLI dict replaces it.
    bundles: Any = None
    # The mix's train split: this many rows (null: the groups' train tasks together), each group holding its
    # weight's share, interleaved in a seeded order; the eval split takes the groups' eval tasks in turn.
    train_size: int | None = None
    seed: int = 0  # the train split's interleaving and which of a group's tasks fill its share
