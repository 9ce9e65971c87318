"""Which tasks an evaluation limited to N of a split plays (`eval.limit`, `trainer.eval_limit`).

A split is often stored in blocks of one task kind (GridSim's eval days: 70 one-hour batteries, then 70 two-hour,
then 60 four-hour), so its first N tasks would measure one kind. A subset instead keeps the split's shares: stratified
over the fact the bundle declares (`Bundle.eval_strata`), else spread evenly over the index range. It depends only
on the split and N, so every evaluation of a run, and every run, plays the same tasks for the same N.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EvalSubset:
    """The task indices an evaluation plays (in index order), out of the split's `total`, and the task fact they
    were stratified by (None: spread over the index range; all tasks when `indices` covers the split)."""

    indices: list[int]
    total: int
    stratified_by: str | None = None

    @property
    def note(self) -> str:
        """How the result should be read: `all 200 tasks`, `40 of 200 tasks, stratified by duration_h`."""
        if len(self.indices) >= self.total:
            return f"all {self.total} tasks"
        how = f"stratified by {self.stratified_by}" if self.stratified_by else "spread evenly over the split"
        return f"{len(self.indices)} of {self.total} tasks, {how}"


def spread(items: list[int], k: int) -> list[int]:
    """`k` of `items` spread evenly: one from each of k equal stretches, at a seeded place within it (the same for
    the same sizes); all of them when k >= len. A fixed place (each stretch's middle) would alias with a split that
    interleaves its kinds (arith's levels 1-5 in turn: 60 of 300 at every fifth task would all be one level)."""
    m = len(items)
    if k >= m:
        return list(items)
    rng = random.Random(f"agentrl eval subset {m} {k}")  # a str seed hashes the same in every process and version
    return [items[rng.randrange(j * m // k, (j + 1) * m // k)] for j in range(k)]


def quotas(sizes: list[int], k: int) -> list[int]:
    """`k` shared out in proportion to `sizes` by largest remainder (each share the floor or the ceiling of its exact
    quota; ties to the earlier stratum), so a subset's kinds hold the split's shares as closely as k allows."""
    total = sum(sizes)
    exact = [k * s / total for s in sizes]
    out = [int(e) for e in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[:k - sum(out)]:
        out[i] += 1
    return out


def eval_subset(bundle: Any, split: str, limit: int | None) -> EvalSubset:
    """The tasks of `split` an evaluation limited to `limit` plays (all when limit is None or covers the split)."""
    total = bundle.splits()[split]
    fact = getattr(bundle, "eval_strata", None) or None
    if limit is None or int(limit) >= total:
        return EvalSubset(list(range(total)), total)
    k = max(int(limit), 0)
    if not fact:
        return EvalSubset(spread(list(range(total)), k), total)
    strata: dict[Any, list[int]] = {}
    for i in range(total):  # first seen, first listed: the order does not depend on the values' types
        strata.setdefault(bundle.task_info(split, i).extra.get(fact), []).append(i)
    if len(strata) < 2:  # one kind (or a fact its tasks do not carry, e.g. self-play's seat): nothing to stratify
        return EvalSubset(spread(list(range(total)), k), total)
    groups = list(strata.values())
    picked = [i for group, n in zip(groups, quotas([len(g) for g in groups], k), strict=True)
              for i in spread(group, n)]
    return EvalSubset(sorted(picked), total, fact)


def eval_indices(bundle: Any, split: str, limit: int | None) -> list[int]:
    """The task indices of `split` an evaluation limited to `limit` plays (`eval_subset`)."""
    return eval_subset(bundle, split, limit).indices
