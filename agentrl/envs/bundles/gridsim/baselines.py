"""Reference policies (random, idle, fixed clock, greedy, best single cycle, optimum) scored on stored task records."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .battery import (
    UNITS_PER_USD,
    Battery,
    best_single_cycle,
    fixed_clock,
    profit_units,
    random_feasible,
    score,
)
from .prices import Rng
from .tasks import GENERATOR_VERSION, cents_of

POLICIES = ("random_feasible", "idle", "fixed_clock", "greedy", "best_single_cycle", "optimum")
RANDOM_DRAWS = 20


def baseline_scores(record: dict[str, Any]) -> dict[str, float]:
    """Every reference policy's score on one task record."""
    battery = Battery.from_json(record["battery"])
    cents = cents_of(record)
    best = int(round(record["optimal_profit"] * UNITS_PER_USD))
    rng = Rng.from_key(f"{GENERATOR_VERSION}/random/{record['split']}/{record['index']}")
    randoms = [score(profit_units(cents, random_feasible(rng.random, battery), battery), best)
               for _ in range(RANDOM_DRAWS)]
    return {
        "random_feasible": sum(randoms) / RANDOM_DRAWS,
        "idle": score(0, best),
        "fixed_clock": score(profit_units(cents, fixed_clock(battery), battery), best),
        "greedy": score(profit_units(cents, record["greedy_schedule"], battery), best),
        "best_single_cycle": score(best_single_cycle(cents, battery), best),
        "optimum": score(profit_units(cents, record["optimal_schedule"], battery), best),
    }


def baseline_table(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean score of each policy by battery duration (`1h`, `2h`, `4h`) and over `all`, rounded to 4 places."""
    sums: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for r in records:
        s = baseline_scores(r)
        for group in ("all", f"{r['battery']['duration_h']}h"):
            counts[group] = counts.get(group, 0) + 1
            acc = sums.setdefault(group, dict.fromkeys(POLICIES, 0.0))
            for p in POLICIES:
                acc[p] += s[p]
    order = sorted((g for g in sums if g != "all"), key=lambda g: int(g[:-1])) + ["all"]
    return {g: {p: round(sums[g][p] / counts[g], 4) for p in POLICIES} for g in order}


def format_table(table: dict[str, dict[str, float]], title: str = "") -> str:
    """A plain-text table: one row per policy, one column per duration group."""
    groups = list(table)
    lines = [title] if title else []
    lines.append(f"{'policy':<18}" + "".join(f"{g:>9}" for g in groups))
    for p in POLICIES:
        lines.append(f"{p:<18}" + "".join(f"{table[g][p]:>9.3f}" for g in groups))
    return "\n".join(lines)
