"""Battery arithmetic: feasibility, integer profit, the exact optimum, the score and the greedy baseline.

Cash is exact: prices are integer cents, efficiency an integer percent, power integer MW, so profit is an
integer in units of 1e-4 $ (`UNITS_PER_USD`). Actions are -1 (sell), 0 (idle), +1 (charge) per hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

HOURS = 24
UNITS_PER_USD = 10_000
_NEG = -(1 << 62)


@dataclass(frozen=True)
class Battery:
    """A battery: power (MW), duration (hours at full power), round-trip efficiency (integer percent)."""

    power_mw: int
    duration_h: int
    efficiency_pct: int

    @property
    def energy_mwh(self) -> int:
        return self.power_mw * self.duration_h

    def to_json(self) -> dict:
        return {"power_mw": self.power_mw, "duration_h": self.duration_h, "energy_mwh": self.energy_mwh,
                "efficiency": self.efficiency_pct / 100}

    @classmethod
    def from_json(cls, d: dict) -> Battery:
        return cls(int(d["power_mw"]), int(d["duration_h"]), int(round(d["efficiency"] * 100)))


def storage_trace(schedule: Sequence[int], duration: int) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Walk a schedule of -1/0/1: (violations as (hour index, action, storage before), storage after each hour).

    A violating hour is treated as idle so later violations stay meaningful.
    """
    soc = 0
    problems: list[tuple[int, int, int]] = []
    trace: list[int] = []
    for t, a in enumerate(schedule):
        nxt = soc + a
        if 0 <= nxt <= duration:
            soc = nxt
        else:
            problems.append((t, a, soc))
        trace.append(soc)
    return problems, trace


def is_feasible(schedule: Sequence[int], duration: int) -> bool:
    soc = 0
    for a in schedule:
        soc += a
        if soc < 0 or soc > duration:
            return False
    return True


def profit_units(cents: Sequence[int], schedule: Sequence[int], battery: Battery) -> int:
    """Cash of a schedule in 1e-4 $: sells earn eta*price*P, charges cost price*P (losses booked at the sale)."""
    eta = battery.efficiency_pct
    total = 0
    for c, a in zip(cents, schedule, strict=True):
        if a == -1:
            total += eta * c
        elif a == 1:
            total -= 100 * c
    return total * battery.power_mw


def optimum(cents: Sequence[int], battery: Battery) -> tuple[int, list[int]]:
    """Exact optimum by DP over integer storage: (profit in 1e-4 $, canonical schedule).

    Ties prefer idle, then sell, then charge, at every hour of the forward pass.
    """
    d = battery.duration_h
    eta = battery.efficiency_pct
    n = len(cents)
    # values[t][s]: best cash from hour t on with s hours stored (per MW).
    nxt = [0] * (d + 1)
    values = [nxt]
    for t in range(n - 1, -1, -1):
        c = cents[t]
        sell, buy = eta * c, 100 * c
        cur = [0] * (d + 1)
        for s in range(d + 1):
            best = nxt[s]
            if s > 0:
                v = sell + nxt[s - 1]
                if v > best:
                    best = v
            if s < d:
                v = nxt[s + 1] - buy
                if v > best:
                    best = v
            cur[s] = best
        values.append(cur)
        nxt = cur
    values.reverse()
    schedule = []
    s = 0
    for t in range(n):
        c = cents[t]
        after = values[t + 1]
        target = values[t][s]
        if after[s] == target:
            a = 0
        elif s > 0 and eta * c + after[s - 1] == target:
            a = -1
        else:
            a = 1
        schedule.append(a)
        s += a
    return values[0][0] * battery.power_mw, schedule


def score(profit: int, best: int) -> float:
    """clamp(0.2 + 0.8 * profit / best, 0, 1), rounded to 6 decimals; `best` > 0."""
    return round(min(max(0.2 + 0.8 * profit / best, 0.0), 1.0), 6)


def greedy(cents: Sequence[int], battery: Battery) -> list[int]:
    """The single-cycle greedy rule (the baseline, ~0.74 mean eval score): pair the D cheapest with the D dearest
    hours, walk in order."""
    d = battery.duration_h
    eta = battery.efficiency_pct
    order = sorted(range(len(cents)), key=lambda t: (cents[t], t))
    cheap, dear = order[:d], order[::-1][:d]
    buy_hours, sell_hours = set(), set()
    for lo, hi in zip(cheap, dear, strict=True):
        if eta * cents[hi] > 100 * cents[lo]:
            buy_hours.add(lo)
            sell_hours.add(hi)
    return _walk(len(cents), d, buy_hours, sell_hours)


def fixed_clock(battery: Battery) -> list[int]:
    """Charge HE12-15, sell HE19-22, whenever storage allows."""
    return _walk(HOURS, battery.duration_h, set(range(11, 15)), set(range(18, 22)))


def _walk(n: int, d: int, buy_hours: set[int], sell_hours: set[int]) -> list[int]:
    soc = 0
    out = []
    for t in range(n):
        if t in buy_hours and soc < d:
            a = 1
        elif t in sell_hours and soc > 0:
            a = -1
        else:
            a = 0
        out.append(a)
        soc += a
    return out


def best_single_cycle(cents: Sequence[int], battery: Battery) -> int:
    """Best profit (1e-4 $) selling at most D hours in the day: one full cycle of throughput."""
    d = battery.duration_h
    eta = battery.efficiency_pct
    # state (stored, sold) -> best cash so far; sold <= d.
    best = {(0, 0): 0}
    for c in cents:
        new: dict[tuple[int, int], int] = {}
        for (s, sold), v in best.items():
            for key, val in (((s, sold), v), ((s - 1, sold + 1), v + eta * c), ((s + 1, sold), v - 100 * c)):
                if 0 <= key[0] <= d and key[1] <= d and val > new.get(key, _NEG):
                    new[key] = val
        best = new
    return max(best.values()) * battery.power_mw


def random_feasible(rng_random, battery: Battery, n: int = HOURS) -> list[int]:
    """A uniformly random feasible action each hour; `rng_random()` returns floats in [0, 1)."""
    d = battery.duration_h
    soc = 0
    out = []
    for _ in range(n):
        options = [a for a in (-1, 0, 1) if 0 <= soc + a <= d]
        a = options[min(int(rng_random() * len(options)), len(options) - 1)]
        out.append(a)
        soc += a
    return out
