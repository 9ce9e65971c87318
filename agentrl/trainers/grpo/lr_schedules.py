"""The RL stage's learning rate per step: a linear warmup, then constant, linear or cosine decay.

Step `s` of `steps` (counted from 1) trains at `lr x lr_factor(s, ...)`: `s / warmup` during the warmup (the
first step already moves), then the schedule over the remaining steps, from the full rate at the first step
after the warmup towards 0 one step past the last. The factor is a pure function of the step, so a resumed run
trains at the same rates as one that never stopped. TRL maps the same names onto transformers' schedules
(`trainers/trl/args.py`), whose warmup starts at 0, one step behind this one.
"""

from __future__ import annotations

import math
from typing import Any

from agentrl.config.trainer import check_lr_schedule


def lr_factor(step: int, steps: int, warmup_steps: int = 0, schedule: str = "constant") -> float:
    """The multiplier of the base learning rate at `step` (1-based) of `steps`."""
    check_lr_schedule(schedule, warmup_steps)
    step, steps, warmup = max(1, int(step)), max(1, int(steps)), int(warmup_steps)
    if step <= warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup - 1) / max(1, steps - warmup))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: Any, base_lr: float, factor: float) -> float:
    """Put every parameter group of `optimizer` at `base_lr x factor`; returns that rate."""
    lr = float(base_lr) * float(factor)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
