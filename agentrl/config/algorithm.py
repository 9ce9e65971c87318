"""The GRPO family's choices (loss, advantage, KL, truncated importance sampling, clipping), their checks, and
what Miles does instead of each choice its launch does not map. The math is agentrl/trainers/grpo/grpo_math.py;
docs/training.md, "Algorithms"."""

from __future__ import annotations

import math
from typing import Any, TypeGuard, TypeVar

LOSSES = ("grpo", "dr_grpo", "dapo", "gspo")
ADVANTAGES = ("group_norm", "group_mean", "rloo", "per_role", "rae", "hierarchical")  # the last three: role_advantages.py
KL_ESTIMATORS = ("k1", "k3")
TIS_MODES = ("truncate", "mask", "ignore")  # what importance sampling does with a weight above tis_cap (grpo_math.py)
TIS_LEVELS = ("token", "sequence")
# Each loss's (clip_low, clip_high) when both are left null: the papers' settings (DAPO's clip-higher 0.28;
# GSPO's sequence-level ratios stay much closer to 1, so its paper clips at 3e-4 / 4e-4).
DEFAULT_CLIPS = {"grpo": (0.2, 0.2), "dr_grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "gspo": (3e-4, 4e-4)}
# Each loss's advantage when `advantage` is left null (Dr. GRPO removes the std normalization).
DEFAULT_ADVANTAGE = {"grpo": "group_norm", "dr_grpo": "group_mean", "dapo": "group_norm", "gspo": "group_norm"}

_T = TypeVar("_T")


def is_set(value: _T | None) -> TypeGuard[_T]:
    """A value to check: not None and not a not-yet-resolved interpolation (checked once resolved, at plan time)."""
    return value is not None and not (isinstance(value, str) and value.startswith("${"))


def check_algorithm(c: Any, key: str = "trainer") -> None:
    """The GRPO family's invariants on a trainer config `c`; a ValueError names the key."""
    loss, advantage = c.loss, c.advantage
    if loss not in LOSSES:
        raise ValueError(f"{key}.loss={loss!r}: choose one of {', '.join(LOSSES)}")
    if advantage is not None and advantage not in ADVANTAGES:
        raise ValueError(f"{key}.advantage={advantage!r}: choose one of {', '.join(ADVANTAGES)} (or null: the loss's own)")
    if loss == "dr_grpo" and advantage in ("group_norm", "per_role"):
        raise ValueError(f"{key}.advantage={advantage} contradicts {key}.loss=dr_grpo, whose point is no std "
                         "normalization: use group_mean, rloo, rae or hierarchical (or leave advantage null)")
    if c.kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"{key}.kl_estimator={c.kl_estimator!r}: choose one of {', '.join(KL_ESTIMATORS)}")
    for name in ("kl_coef", "entropy_coef"):
        value = float(getattr(c, name))
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{key}.{name} must be >= 0 (0: off), got {getattr(c, name)}")
    tis = float(c.tis_cap)
    if not (tis == 0 or (math.isfinite(tis) and tis >= 1)):
        raise ValueError(f"{key}.tis_cap={tis}: the truncation cap must be >= 1 (an on-policy token has weight 1), "
                         "or 0 to turn truncated importance sampling off")
    if c.tis_mode not in TIS_MODES:
        raise ValueError(f"{key}.tis_mode={c.tis_mode!r}: choose one of {', '.join(TIS_MODES)}")
    if c.tis_level not in TIS_LEVELS:
        raise ValueError(f"{key}.tis_level={c.tis_level!r}: choose one of {', '.join(TIS_LEVELS)}")
    if tis == 0 and c.tis_mode != "ignore" and (c.tis_mode, c.tis_level) != ("truncate", "token"):
        raise ValueError(f"{key}.tis_mode={c.tis_mode} / tis_level={c.tis_level} weight truncated importance "
                         f"sampling, which {key}.tis_cap=0 turns off: set tis_cap >= 1 or leave them at their defaults")
    low, high = c.clip_low, c.clip_high
    if is_set(low) and not 0 <= float(low) < 1:
        raise ValueError(f"{key}.clip_low must be in [0, 1) (the ratio's floor is 1 - clip_low), got {low}")
    if is_set(high) and not (math.isfinite(float(high)) and float(high) >= 0):
        raise ValueError(f"{key}.clip_high must be >= 0, got {high}")


# What Miles does instead of each built-in choice its launch does not map: the flags to pass in trainer.extra_args
# (they come last, so they override the defaults the launch sets).
MILES_LOSS_FLAGS = {
    "dr_grpo": "trainer.extra_args='[--disable-grpo-std-normalization,--custom-pg-loss-reducer-function-path,"
               "<Miles' examples/Dr.GRPO/custom_reducer.py:get_pg_loss_reducer>]'",
    "dapo": "trainer.extra_args='[--calculate-per-token-loss]' with trainer.clip_high=0.28 (--eps-clip-high); "
            "Miles has no overlong penalty, and the group filter already does dynamic sampling",
    "gspo": "trainer.extra_args='[--advantage-estimator,gspo]' with trainer.clip_low=3e-4 trainer.clip_high=4e-4",
}
MILES_ADVANTAGE_FLAGS = {
    "group_mean": "trainer.extra_args='[--disable-grpo-std-normalization]'",
    "rloo": "no leave-one-out baseline in Miles (its closest, --advantage-estimator reinforce_plus_plus_baseline, "
            "subtracts the group mean); keep group_norm, or train with trainer=grpo",
    "per_role": "no per-role scale in Miles; keep group_norm, or train with trainer=grpo",
    "rae": "no per-role EMA baseline in Miles; keep group_norm, or train with trainer=grpo",
    "hierarchical": "no per-play solver groups in Miles; keep group_norm, or train with trainer=grpo",
}


def miles_algorithm_problem(c: Any) -> str | None:
    """Why a built-in GRPO choice cannot apply under trainer=miles, naming the Miles flag to use; None if all can."""
    if c.loss != "grpo":
        hint = MILES_LOSS_FLAGS.get(c.loss, f"one of {', '.join(LOSSES)}")
        return (f"trainer.loss={c.loss} does not apply under trainer=miles (Miles runs its own GRPO, "
                f"--advantage-estimator grpo); for Miles use {hint}")
    if c.advantage not in (None, "group_norm"):
        hint = MILES_ADVANTAGE_FLAGS.get(c.advantage, f"one of {', '.join(ADVANTAGES)}")
        return f"trainer.advantage={c.advantage} does not apply under trainer=miles; for Miles: {hint}"
    if c.kl_estimator is not None:
        return (f"trainer.kl_estimator={c.kl_estimator} does not apply under trainer=miles: set "
                f"trainer.kl_loss_type={c.kl_estimator} (Miles' --kl-loss-type: k1, k2, k3 or low_var_kl)")
    if float(c.entropy_coef) != 0:
        return (f"trainer.entropy_coef={c.entropy_coef} does not apply under trainer=miles: use "
                f"trainer.extra_args='[--entropy-coef,{c.entropy_coef}]' (Miles' --entropy-coef)")
    if float(c.tis_cap) != 0:
        return (f"trainer.tis_cap={c.tis_cap} does not apply under trainer=miles: use "
                f"trainer.extra_args='[--use-tis,--tis-clip,{c.tis_cap}]' (Miles' truncated importance sampling)")
    if int(c.max_staleness) != 0:
        return (f"trainer.max_staleness={c.max_staleness} does not apply under trainer=miles: its bound, Miles' "
                f"--max-weight-staleness (with --partial-rollout), is read only by Miles' fully-async rollout "
                f"(examples/fully_async in its repository, not in the miles-rl 0.0.2 wheel), and this launch runs "
                f"train.py's synchronous loop; use trainer=grpo for K > 0")
    return None
