"""The options of the bundles served from a folder (gridsim, arith): one home for their defaults.

The env schema (`config/env.py`) extends these dataclasses, and each bundle's `OPTIONS` is `option_defaults` of
its own. Standard library only, as the bundles are: a sandbox rebuilds a bundle from its spec in a bare process
(tests/envs/test_bundles.py checks that nothing heavy is imported there).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class GridSimOptions:
    # full: the natural-language prompt for real LLMs; compact: the same facts in a few dozen tokens.
    prompt_style: str = "full"
    # > 0: a split `generated` of that many fresh train-like days (train dates, never an eval date), drawn on
    # demand; env.train_split=generated trains RL on them instead of the 2,000 stored days.
    generated_days: int = 0


@dataclass
class ArithOptions:
    # Optional DAPO-style JSON Lines file of your own (prompt/label keys below) served as the train split.
    data_file: str | None = None
    prompt_key: str = "prompt"
    label_key: str = "label"


def option_defaults(options: type) -> dict[str, Any]:
    """A bundle's `OPTIONS`: each option's name and default, in the options dataclass's order."""
    return {f.name: f.default for f in dataclasses.fields(options)}
