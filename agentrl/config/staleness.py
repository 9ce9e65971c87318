"""`trainer.max_staleness` and `trainer.stale_policy`: their checks, and the retired key they replace."""

from __future__ import annotations

from typing import Any

STALE_POLICIES = ("wait", "pace", "drop")  # trainer.stale_policy (agentrl/trainers/grpo/play_ahead.py)


def check_retired_overlap(c: Any) -> None:
    """The retired `trainer.off_policy_steps`, when set, fails naming its heir `trainer.max_staleness`."""
    if c.off_policy_steps is not None:
        raise ValueError(f"trainer.off_policy_steps was renamed trainer.max_staleness (K: how many weight versions "
                         f"a trained sample may lag the one that sampled its first token; 0 plays then trains, 1 is "
                         f"the old overlap): set trainer.max_staleness={c.off_policy_steps} instead")


def check_staleness(c: Any) -> None:
    """`trainer.max_staleness` (K >= 0) and `trainer.stale_policy` of the built-in GRPO."""
    check_retired_overlap(c)
    if not isinstance(c.max_staleness, int) or c.max_staleness < 0:
        raise ValueError(f"trainer.max_staleness must be an integer >= 0 (0: play, then train), got {c.max_staleness!r}")
    if c.stale_policy not in STALE_POLICIES:
        raise ValueError(f"trainer.stale_policy={c.stale_policy!r}: choose one of {', '.join(STALE_POLICIES)}")
