"""A seeded RNG whose stream is stable across Pythons, shared by the built-in bundles (GridSim, arith).

Only `random.Random.random()` is used, whose stream Python guarantees across versions for a given integer
seed; every distribution is built on it here, so generated data can be regenerated bit for bit on any Python 3.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence


class Rng:
    """Distributions on top of `random.Random.random()` only (its stream is stable across Pythons)."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)
        self.random = self._r.random

    @classmethod
    def from_key(cls, key: str) -> Rng:
        """The RNG for a string key: seed = first 8 bytes of sha256(key), little endian."""
        return cls(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.random()

    def normal(self) -> float:
        # Box-Muller, one draw per call (no cached second value, so the stream is a pure function of calls).
        u1 = 1.0 - self.random()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * self.random())

    def lognormal(self, sigma: float) -> float:
        return math.exp(sigma * self.normal())

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi]."""
        return lo + min(int(self.random() * (hi - lo + 1)), hi - lo)

    def bernoulli(self, p: float) -> bool:
        return self.random() < p

    def choice(self, items: Sequence, weights: Sequence[float] | None = None):
        if weights is None:
            return items[self.randint(0, len(items) - 1)]
        x = self.random() * sum(weights)
        for item, w in zip(items, weights, strict=True):
            x -= w
            if x < 0:
                return item
        return items[-1]

    def shuffle(self, items: list) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.randint(0, i)
            items[i], items[j] = items[j], items[i]
