"""An eval of N tasks represents its split: GridSim's 40-day subset holds the split's battery kinds in their shares
(the split is stored in blocks of one duration, so its first 40 days are all one-hour batteries); a bundle without
strata gets N spread over the split; the same N always picks the same tasks, and the subset is named."""

from __future__ import annotations

from collections import Counter

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.play.eval_subset import eval_subset, quotas, spread
from agentrl.play.evaluate import eval_indices


def _durations(bundle: object, indices: list[int]) -> Counter[int]:
    return Counter(bundle.task_info("eval", i).extra["duration_h"] for i in indices)  # type: ignore[attr-defined]


@pytest.mark.parametrize("n", [40, 12, 7, 199])
def test_a_gridsim_subset_holds_the_splits_battery_shares(n: int) -> None:
    bundle = load_bundle("gridsim")
    total = bundle.splits()["eval"]
    split = _durations(bundle, list(range(total)))
    assert len(split) == 3, split  # 1h, 2h and 4h batteries
    subset = eval_subset(bundle, "eval", n)
    assert len(subset.indices) == len(set(subset.indices)) == n
    assert subset.indices == sorted(subset.indices) and all(0 <= i < total for i in subset.indices)
    kinds = _durations(bundle, subset.indices)
    for hours, count in split.items():  # each kind within one task of its exact share
        assert abs(kinds[hours] - n * count / total) < 1, (hours, kinds, split)
    assert subset.note == f"{n} of {total} tasks, stratified by duration_h"


def test_the_40_day_subset_is_not_the_first_40_and_is_the_same_every_time() -> None:
    bundle = load_bundle("gridsim")
    assert set(_durations(bundle, list(range(40)))) == {1}  # why first-N misleads
    first = eval_indices(bundle, "eval", 40)
    assert first == eval_indices(load_bundle("gridsim"), "eval", 40) == eval_subset(bundle, "eval", 40).indices
    assert _durations(bundle, first) == Counter({1: 14, 2: 14, 4: 12})  # 70/70/60 of 200, x 40


def test_no_limit_or_a_limit_past_the_split_plays_it_all() -> None:
    bundle = load_bundle("gridsim")
    for limit in (None, 200, 500):
        subset = eval_subset(bundle, "eval", limit)
        assert subset.indices == list(range(200)) and subset.note == "all 200 tasks"


def test_a_bundle_without_strata_gets_an_even_spread() -> None:
    bundle = load_bundle("arith")
    assert bundle.eval_strata is None
    total = bundle.splits()["eval"]
    subset = eval_subset(bundle, "eval", 10)
    assert [i * 10 // total for i in subset.indices] == list(range(10))  # one in each tenth, to the split's end
    assert subset.note == f"10 of {total} tasks, spread evenly over the split"


def test_spread_and_quotas_by_hand() -> None:
    picks = spread(list(range(10)), 5)
    assert [p // 2 for p in picks] == [0, 1, 2, 3, 4] and picks == spread(list(range(10)), 5)  # one per stretch
    assert spread([4, 5, 6], 5) == [4, 5, 6]
    # a split that interleaves five kinds in turn (arith's levels): 60 of 300 hold every kind, not every fifth task
    picks = spread(list(range(300)), 60)
    assert {p % 5 for p in picks} == {0, 1, 2, 3, 4}
    assert spread(list(range(10)), 0) == []
    assert quotas([70, 70, 60], 40) == [14, 14, 12]
    assert quotas([70, 70, 60], 7) == [3, 2, 2]  # exact 2.45, 2.45, 2.1: the first of the tied remainders
    assert sum(quotas([1, 1, 1], 2)) == 2


def test_a_fact_the_tasks_do_not_carry_is_no_stratum() -> None:
    # textarena self-play seats nobody (seat None on every match): a spread, and named as one
    bundle = load_bundle("textarena", eval_opponent=None)
    subset = eval_subset(bundle, "eval", 6)
    assert subset.stratified_by is None and subset.note == "6 of 64 tasks, spread evenly over the split"
    seated = eval_subset(load_bundle("textarena"), "eval", 6)  # against a scripted player: three of each seat
    assert seated.stratified_by == "seat" and sum(i % 2 for i in seated.indices) == 3
