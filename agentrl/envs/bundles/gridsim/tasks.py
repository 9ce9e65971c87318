"""Task generation: each task is a pure function of (split, index); dates, batteries and prices are drawn from
seeded generators, so the stored packs can be regenerated bit for bit (`python -m agentrl.envs.bundles.gridsim build`)."""

from __future__ import annotations

import datetime as dt
from functools import lru_cache
from typing import Any

from .battery import UNITS_PER_USD, Battery, greedy, optimum, profit_units, score
from .prices import SEASONS, SETTLEMENT_POINTS, Rng, generate_prices, season_of

GENERATOR_VERSION = "gridsim-v1"
SPLIT_SIZES = {"train": 2000, "eval": 200}
EVAL_DURATIONS = (1,) * 70 + (2,) * 70 + (4,) * 60
DURATIONS = (1, 2, 4)
TRAIN_DURATION_WEIGHTS = (35, 35, 30)
POWERS = (10, 20, 50, 100, 150, 200, 300)
POWER_WEIGHTS = (10, 15, 25, 20, 12, 12, 6)
EFFICIENCIES = (80, 82, 85, 87, 90)
EFFICIENCY_WEIGHTS = (15, 20, 35, 15, 15)
FIRST_DATE, LAST_DATE = dt.date(2023, 1, 1), dt.date(2025, 12, 31)
N_EVAL_DATES = 200
DATE_PERMUTATION_SEED = 20240101
MAX_TRIES = 100
# The stream of the bundle's `generated` split (env.generated_days): a key no SFT stream uses (those are keyed by
# the run's seed), so RL on it plays days the warm start never saw.
GENERATED_SPLIT_STREAM = 1_000_003
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@lru_cache(maxsize=1)
def split_dates() -> dict[str, tuple[dt.date, ...]]:
    """A fixed permutation of every date: the first 200 are eval dates, the rest train (disjoint)."""
    days = [FIRST_DATE + dt.timedelta(days=i) for i in range((LAST_DATE - FIRST_DATE).days + 1)]
    Rng(DATE_PERMUTATION_SEED).shuffle(days)
    return {"eval": tuple(sorted(days[:N_EVAL_DATES])), "train": tuple(sorted(days[N_EVAL_DATES:]))}


@lru_cache(maxsize=1)
def _eval_dates_by_season() -> dict[str, tuple[dt.date, ...]]:
    return {s: tuple(d for d in split_dates()["eval"] if season_of(d) == s) for s in SEASONS}


def task_id(split: str, index: int, date: str, point: str, duration: int) -> str:
    return f"gridsim-{split}-{index:04d}-{date}-{point}-D{duration}"


def make_task(split: str, index: int) -> dict[str, Any]:
    """The full task record (inputs and references) for task `index` of `split`."""
    if split not in SPLIT_SIZES:
        raise KeyError(f"gridsim has no split {split!r}; splits are {sorted(SPLIT_SIZES)}")
    if not 0 <= index < SPLIT_SIZES[split]:
        raise IndexError(f"gridsim {split} index {index} is out of range 0..{SPLIT_SIZES[split] - 1}")
    return _draw_task(Rng.from_key(f"{GENERATOR_VERSION}/{split}/{index}"), split, index)


def generated_task(index: int, seed: int = 0) -> dict[str, Any]:
    """Task `index` of an unbounded train-like stream keyed by `seed`: the train split's dates (never an eval
    date), batteries and price generator, drawn from keys no stored task uses. Extra SFT data
    (`trainer.warm_start.generated`); its records say split "generated"."""
    if index < 0:
        raise IndexError(f"gridsim generated task index must be >= 0, got {index}")
    return _draw_task(Rng.from_key(f"{GENERATOR_VERSION}/generated/{seed}/{index}"), "generated", index)


def _draw_task(rng: Rng, split: str, index: int) -> dict[str, Any]:
    points = list(SETTLEMENT_POINTS)
    point_weights = [SETTLEMENT_POINTS[p][4] for p in points]
    if split == "eval":
        duration = EVAL_DURATIONS[index]
        date = rng.choice(_eval_dates_by_season()[SEASONS[index % 4]])
    else:
        duration = rng.choice(DURATIONS, TRAIN_DURATION_WEIGHTS)
        date = rng.choice(split_dates()["train"])
    point = rng.choice(points, point_weights)
    battery = Battery(rng.choice(POWERS, POWER_WEIGHTS), duration, rng.choice(EFFICIENCIES, EFFICIENCY_WEIGHTS))

    # Keep a day only if it is worth at least $1/MW of arbitrage, so the optimum is always > 0.
    for _ in range(MAX_TRIES):
        cents = generate_prices(rng, date, point)
        best, best_schedule = optimum(cents, battery)
        if best >= UNITS_PER_USD * battery.power_mw:
            break
    else:  # pragma: no cover - never happens with the shipped generator
        raise RuntimeError(f"gridsim {split}/{index}: no day worth $1/MW in {MAX_TRIES} tries")

    greedy_schedule = greedy(cents, battery)
    greedy_units = profit_units(cents, greedy_schedule, battery)
    iso = date.isoformat()
    return {
        "task_id": task_id(split, index, iso, point, duration),
        "split": split,
        "index": index,
        "date": iso,
        "weekday": WEEKDAYS[date.weekday()],
        "season": season_of(date),
        "settlement_point": point,
        "prices": [c / 100 for c in cents],
        "battery": battery.to_json(),
        "optimal_profit": best / UNITS_PER_USD,
        "optimal_schedule": best_schedule,
        "greedy_schedule": greedy_schedule,
        "greedy_profit": greedy_units / UNITS_PER_USD,
        "greedy_score": score(greedy_units, best),
    }


def cents_of(record: dict[str, Any]) -> list[int]:
    """A record's prices back in integer cents (stored as dollars with two decimals)."""
    return [int(round(p * 100)) for p in record["prices"]]
