"""The project's method for every learning claim: the paired per-task difference with its standard error, and
pass@k. Plain arithmetic on lists of floats (no I/O): `agentrl compare`, the evals and the benchmarks share it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """The mean and the standard error of the mean (sample standard deviation / sqrt(n); 0 for one value)."""
    if not xs:
        raise ValueError("mean_se: no values")
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)


@dataclass(frozen=True)
class PairedDiff:
    """A minus B, task by task: the mean difference, its standard error, and the tasks A won, lost and tied."""

    mean: float
    se: float
    n: int
    won: int
    lost: int
    tied: int

    @property
    def z(self) -> float:
        """The mean difference in standard errors (inf when se is 0 and the mean is not)."""
        if self.se > 0:
            return self.mean / self.se
        return 0.0 if self.mean == 0 else math.copysign(math.inf, self.mean)

    def line(self) -> str:
        """`+0.060 ± 0.019 (3.2 se), n 200: won 90, lost 50, tied 60`."""
        return (f"{self.mean:+.4f} ± {self.se:.4f} ({self.z:.1f} se), n {self.n}: "
                f"won {self.won}, lost {self.lost}, tied {self.tied}")


def paired_diff(a: Sequence[float], b: Sequence[float], *, tie: float = 1e-9) -> PairedDiff:
    """A - B per task (the same tasks, in the same order); a difference within `tie` is a tie."""
    if len(a) != len(b):
        raise ValueError(f"paired_diff: {len(a)} values against {len(b)}; a paired difference needs the same tasks")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, se = mean_se(diffs)
    won = sum(d > tie for d in diffs)
    lost = sum(d < -tie for d in diffs)
    return PairedDiff(mean, se, len(diffs), won, lost, len(diffs) - won - lost)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a task with `c` passing samples out of `n` (Chen et al. 2021): the chance that k
    samples drawn without replacement from the n hold at least one pass, 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
