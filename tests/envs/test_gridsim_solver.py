"""The exact optimum against brute force and independent solvers; profit, score, greedy and the generator."""

from __future__ import annotations

import heapq
import itertools
import random
import statistics

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.gridsim.battery import (
    UNITS_PER_USD,
    Battery,
    greedy,
    is_feasible,
    optimum,
    profit_units,
    score,
    storage_trace,
)
from agentrl.envs.bundles.gridsim.tasks import EVAL_DURATIONS, make_task, split_dates

# A worked example: ERCOT LZ_CPS on 2024-02-08 (hourly $/MWh), a 100 MW / 4 h battery at 85% round trip.
EXAMPLE_PRICES = [19.18, 17.92, 17.54, 18.42, 17.67, 17.38, 17.83, 23.31, 40.32, 37.60, 17.52, 11.43,
                  9.09, 9.20, 10.12, 12.05, 14.57, 16.70, 19.33, 28.51, 28.67, 21.16, 19.20, 18.93]


def _cents(prices):
    return [int(round(p * 100)) for p in prices]


def _random_day(rng: random.Random, hours: int) -> list[int]:
    """Cents in [-50, 120] $/MWh, with a negative-price stretch on about half the days."""
    cents = [rng.randint(-2000, 12000) for _ in range(hours)]
    if rng.random() < 0.5:
        start = rng.randrange(hours)
        for t in range(start, min(hours, start + 4)):
            cents[t] = -rng.randint(1, 5000)
    return cents


def test_spec_example_optimum_and_greedy():
    cents, battery = _cents(EXAMPLE_PRICES), Battery(100, 4, 85)
    best, schedule = optimum(cents, battery)
    assert best == 7663_5000  # $7,663.50 in 1e-4 $
    assert schedule == [0, 0, 1, 0, 1, 1, 0, -1, -1, -1, 0, 1, 1, 1, 1, 0, 0, 0, -1, -1, -1, -1, 0, 0]
    g = greedy(cents, battery)
    assert g == [0] * 11 + [1, 1, 1, 1] + [0] * 4 + [-1, -1, 0, 0, 0]
    assert profit_units(cents, g, battery) == 876_3000 and score(profit_units(cents, g, battery), best) == 0.291478


@pytest.mark.parametrize("duration", [1, 2, 4])
def test_dp_equals_brute_force_on_short_horizons(duration):
    rng = random.Random(duration)
    schedules = [s for s in itertools.product((-1, 0, 1), repeat=8) if is_feasible(s, duration)]
    for _ in range(40):
        hours = rng.randint(1, 8)
        cents = _random_day(rng, hours)
        battery = Battery(rng.choice((10, 50, 300)), duration, rng.choice((80, 85, 90)))
        feasible = {s[:hours] for s in schedules}
        brute = max(profit_units(cents, s, battery) for s in feasible)
        best, schedule = optimum(cents, battery)
        assert best == brute and is_feasible(schedule, duration)
        assert profit_units(cents, schedule, battery) == best
        # Canonical tie-break: idle before sell before charge, compared hour by hour.
        key = {0: 0, -1: 1, 1: 2}
        optimal = sorted(tuple(key[a] for a in s) for s in feasible if profit_units(cents, s, battery) == best)
        assert tuple(key[a] for a in schedule) == optimal[0]


def _longest_path(cents: list[int], battery: Battery) -> int:
    """Independent solver: Dijkstra on the (hour, storage) graph with costs shifted to be non-negative."""
    d, eta = battery.duration_h, battery.efficiency_pct
    shift = max(max(100 * abs(c), eta * abs(c)) for c in cents)  # every edge gets cost shift - reward >= 0
    dist = {(0, 0): 0}
    heap = [(0, 0, 0)]
    while heap:
        cost, t, s = heapq.heappop(heap)
        if cost > dist[(t, s)] or t == len(cents):
            continue
        for a, reward in ((0, 0), (-1, eta * cents[t]), (1, -100 * cents[t])):
            if 0 <= s + a <= d:
                nxt, c2 = (t + 1, s + a), cost + shift - reward
                if c2 < dist.get(nxt, float("inf")):
                    dist[nxt] = c2
                    heapq.heappush(heap, (c2, *nxt))
    best_cost = min(v for (t, _), v in dist.items() if t == len(cents))
    return (len(cents) * shift - best_cost) * battery.power_mw


def test_dp_equals_shortest_path_on_random_days_with_negative_prices():
    rng = random.Random(7)
    for _ in range(300):
        battery = Battery(rng.choice((10, 100, 300)), rng.choice((1, 2, 4)), rng.choice((80, 82, 85, 87, 90)))
        cents = _random_day(rng, 24)
        assert optimum(cents, battery)[0] == _longest_path(cents, battery)


def test_dp_equals_a_milp_on_stored_and_random_days():
    """The spec's check: binary charge/sell variables, c_t + d_t <= 1, cumulative storage bounds."""
    np = pytest.importorskip("numpy")
    opt = pytest.importorskip("scipy.optimize")
    bundle = load_bundle("gridsim")
    rng = random.Random(11)
    days = [(_cents(r["prices"]), Battery.from_json(r["battery"])) for r in bundle.rows("eval")[::4]]
    negative = [(c, b) for c, b in days if min(c) < 0]
    days += [(_random_day(rng, 24), Battery(50, rng.choice((1, 2, 4)), 85)) for _ in range(40)]
    assert negative, "the eval pack should include negative-price days"
    lower = np.tril(np.ones((24, 24)))
    for cents, battery in days:
        c = np.array(cents, dtype=float)
        # x = [charge_0..23, sell_0..23]; maximise eta*c.sell - 100*c.charge.
        objective = -np.concatenate([-100 * c, battery.efficiency_pct * c])
        soc = np.hstack([lower, -lower])
        cons = [opt.LinearConstraint(soc, 0, battery.duration_h),
                opt.LinearConstraint(np.hstack([np.eye(24), np.eye(24)]), 0, 1)]
        res = opt.milp(objective, constraints=cons, integrality=np.ones(48), bounds=opt.Bounds(0, 1))
        assert res.success
        assert optimum(cents, battery)[0] == round(-res.fun) * battery.power_mw


def test_storage_trace_and_profit_are_exact():
    problems, trace = storage_trace([1, 1, 1, -1, -1, -1, -1], 2)
    assert problems == [(2, 1, 2), (5, -1, 0), (6, -1, 0)] and trace == [1, 2, 2, 1, 0, 0, 0]
    battery = Battery(10, 1, 87)
    # Buy at $-3.33 (paid to charge), sell at $0.01: all in 1e-4 $.
    assert profit_units([-333, 1], [1, -1], battery) == (100 * 333 + 87 * 1) * 10
    assert score(0, 5) == 0.2 and score(5, 5) == 1.0 and score(-100, 5) == 0.0
    assert score(-UNITS_PER_USD, 4 * UNITS_PER_USD) == 0.0  # a loss of 25% of the optimum is "nothing useful"


def test_splits_dates_and_stratification():
    dates = split_dates()
    assert not set(dates["eval"]) & set(dates["train"]) and len(dates["eval"]) == 200
    bundle = load_bundle("gridsim")
    ev, tr = bundle.rows("eval"), bundle.rows("train")
    assert not {r["date"] for r in ev} & {r["date"] for r in tr}
    assert [r["battery"]["duration_h"] for r in ev] == list(EVAL_DURATIONS)
    assert [r["season"] for r in ev[:8]] == ["winter", "spring", "summer", "fall"] * 2
    assert all(statistics.mode(r["season"] for r in ev[i::4]) == r0["season"] for i, r0 in enumerate(ev[:4]))
    durations = [r["battery"]["duration_h"] for r in tr]
    assert 0.30 < durations.count(1) / 2000 < 0.40 and 0.25 < durations.count(4) / 2000 < 0.35
    assert all(r["optimal_profit"] >= r["battery"]["power_mw"] for r in ev + tr)


@pytest.mark.parametrize("split,index", [("eval", 0), ("eval", 144), ("eval", 199), ("train", 0), ("train", 1999)])
def test_tasks_are_pure_functions_of_split_and_index(split, index):
    assert make_task(split, index) == load_bundle("gridsim").row(split, index)


def test_greedy_is_calibrated_with_four_hour_days_hardest():
    ev = load_bundle("gridsim").rows("eval")
    by = {d: statistics.mean(r["greedy_score"] for r in ev if r["battery"]["duration_h"] == d) for d in (1, 2, 4)}
    overall = statistics.mean(r["greedy_score"] for r in ev)
    assert 0.70 <= overall <= 0.82
    assert by[4] < by[1] and by[4] < by[2]
