"""Range checks for numeric config keys, run when a schema is built (its `__post_init__`), so a bad value fails
when the plan is built, naming the key, instead of training on it (a NaN learning rate makes NaN weights).

Each check states the range it accepts (`not lo <= x`): a NaN compares false with every bound, so it is refused
with the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def check_counts(prefix: str, obj: Any, names: Iterable[str], *, minimum: int = 1, meaning: str = "") -> None:
    """Each `obj.<name>` is an integer >= `minimum`."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or not value >= minimum:
            raise ValueError(f"{prefix}.{name} must be an integer >= {minimum}{meaning}, got {value!r}")


def check_finite(prefix: str, obj: Any, names: Iterable[str], *, positive: bool = False) -> None:
    """Each `obj.<name>` is a finite number >= 0 (> 0 when `positive`)."""
    for name in names:
        value = getattr(obj, name)
        ok = _number(value) and math.isfinite(value) and (value > 0 if positive else value >= 0)
        if not ok:
            raise ValueError(f"{prefix}.{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


def check_ports(prefix: str, obj: Any, names: Iterable[str]) -> None:
    """Each `obj.<name>` is a TCP port, or 0 (a free one is picked)."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise ValueError(f"{prefix}.{name} must be a port from 1 to 65535 (0: a free one), got {value!r}")


def check_trainer_numbers(c: Any) -> None:
    """The keys every trainer has (`TrainerConfig`): steps and lr, and the eval and checkpoint cadence."""
    check_counts("trainer", c, ("steps", "keep_checkpoints"))
    check_counts("trainer", c, ("eval_every",), minimum=0, meaning=" (0: only before and after training)")
    check_counts("trainer", c, ("checkpoint_every",), minimum=0, meaning=" (0: never)")
    check_finite("trainer", c, ("lr",), positive=True)
    if c.eval_limit is not None:
        check_counts("trainer", c, ("eval_limit",), meaning=" (or null: the whole eval split)")


def check_rl_numbers(c: Any, counts: Iterable[str] = (), zero_ok: Iterable[str] = ()) -> None:
    """An RL trainer's keys (grpo, trl): `check_trainer_numbers`, the batch shape, threads and the optimizer's
    rates, and the trainer's own `counts` (>= 1) and `zero_ok` (>= 0)."""
    check_trainer_numbers(c)
    check_counts("trainer", c, ("prompts_per_step", "samples_per_prompt", "micro_batch_samples", *counts))
    check_counts("trainer", c, ("threads", *zero_ok), minimum=0)
    check_finite("trainer", c, ("grad_clip",), positive=True)
    check_finite("trainer", c, ("weight_decay",))
