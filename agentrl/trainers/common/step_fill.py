"""How a step is filled: `RowStream`, the seeded order train rows are drawn in (the built-in GRPO trainer's, and
TRL's dataset in the same order), and `fill_step`, the built-in trainer's loop that draws, plays and filters rows
until the step has its groups. How a request samples is `Plan.sampling`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from agentrl.agents.record import Rollout


class RowStream:
    """Train-row indices: a fresh seeded permutation every epoch, read through a cursor (saved in checkpoints)."""

    def __init__(self, count: int, seed: int, cursor: int = 0) -> None:
        self.count, self.seed, self.cursor = count, seed, cursor
        self._epoch = -1
        self._order: list[int] = []

    def next(self) -> int:
        epoch, pos = divmod(self.cursor, self.count)
        if epoch != self._epoch:
            self._order = list(range(self.count))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        self.cursor += 1
        return self._order[pos]


def fill_step(draw: Callable[[], int], play: Callable[[list[int], int], list[list[Rollout]]], *, want: int,
              budget: int, drop: Callable[[list[Rollout]], str | None]
              ) -> tuple[list[list[Rollout]], list[Rollout], Counter[str], int]:
    """Draw and play rows until `want` groups pass the filter (`drop` returns None) or `budget` rows were drawn.

    Returns (kept groups, every rollout played, dropped groups by reason, rows drawn). Each round draws only as
    many rows as groups are still missing, so a step never trains on more than `want` groups.
    """
    kept: list[list[Rollout]] = []
    seen: list[Rollout] = []
    dropped: Counter[str] = Counter()
    drawn = attempt = 0
    while len(kept) < want and drawn < budget:
        indices = [draw() for _ in range(min(want - len(kept), budget - drawn))]
        drawn += len(indices)
        for group in play(indices, attempt):
            seen += group
            reason = drop(group)
            if reason is None:
                kept.append(group)
            else:
                dropped[reason] += 1
        attempt += 1
    return kept, seen, dropped, drawn
