"""Generated integer-answer problems in five levels of difficulty, each a pure function of (split, index).

Level 1: one or two operations. 2: multi-step arithmetic with parentheses. 3: modular arithmetic.
4: short word problems. 5: counting and series problems that need a few reasoning steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.envs.seeded_rng import Rng

GENERATOR_VERSION = "arith-v1"
SPLIT_SIZES = {"train": 3000, "eval": 300}
LEVELS = 5
INSTRUCTION = ("Solve the problem below. Work step by step, then give the final integer on the last line "
               "in the form `Answer: <integer>`.")


def _level1(r: Rng) -> tuple[str, int, str]:
    a, b, c = r.randint(2, 60), r.randint(2, 30), r.randint(2, 12)
    form = r.randint(0, 2)
    if form == 0:
        return f"What is {a} + {b} × {c}?", a + b * c, "arithmetic"
    if form == 1:
        return f"What is {a * c} ÷ {c} − {b}?", a - b, "arithmetic"
    return f"What is {a} × {c} − {b}?", a * c - b, "arithmetic"


def _level2(r: Rng) -> tuple[str, int, str]:
    a, b, c, d, e = (r.randint(2, 40), r.randint(2, 40), r.randint(2, 15), r.randint(2, 12), r.randint(2, 9))
    form = r.randint(0, 2)
    if form == 0:
        return f"Compute ({a} + {b}) × {c} − {d * e} ÷ {e}.", (a + b) * c - d, "arithmetic"
    if form == 1:
        return f"Compute {a} × ({b} − {c}) + ({d} + {e}) × {c}.", a * (b - c) + (d + e) * c, "arithmetic"
    return (f"Compute ({a} − {b}) × ({c} + {d}) − {e}².", (a - b) * (c + d) - e * e, "arithmetic")


def _level3(r: Rng) -> tuple[str, int, str]:
    m = r.randint(5, 23)
    form = r.randint(0, 2)
    if form == 0:
        a, b, c = r.randint(20, 999), r.randint(20, 999), r.randint(1, 99)
        return f"What is the remainder when {a} × {b} + {c} is divided by {m}?", (a * b + c) % m, "modular"
    if form == 1:
        a, k = r.randint(2, 30), r.randint(3, 12)
        return f"What is {a}^{k} mod {m}?", pow(a, k, m), "modular"
    a, b = r.randint(100, 9999), r.randint(100, 9999)
    return f"Find ({a} + {b}) mod {m}, as an integer from 0 to {m - 1}.", (a + b) % m, "modular"


_NAMES = ("Maya", "Omar", "Lena", "Tariq", "Sofia", "Kenji", "Amara", "Diego", "Priya", "Jonas")
_ITEMS = (("muffins", "cookies"), ("notebooks", "pens"), ("apples", "pears"), ("tickets", "programs"))


def _level4(r: Rng) -> tuple[str, int, str]:
    name = r.choice(_NAMES)
    form = r.randint(0, 3)
    if form == 0:
        first, second = r.choice(_ITEMS)
        p, q, x, y = r.randint(2, 9), r.randint(1, 6), r.randint(2, 8), r.randint(2, 10)
        bill = ((p * x + q * y) // 20 + 1 + r.randint(0, 2)) * 20
        return (f"A shop sells {first} for ${p} each and {second} for ${q} each. {name} buys {x} {first} and "
                f"{y} {second} and pays with ${bill}. How many dollars of change does {name} get?",
                bill - p * x - q * y, "word")
    if form == 1:
        v, t1, w, t2 = r.randint(40, 120), r.randint(1, 5), r.randint(30, 110), r.randint(1, 4)
        return (f"A train travels at {v} km/h for {t1} hours, then at {w} km/h for {t2} hours. How many "
                "kilometres does it travel in total?", v * t1 + w * t2, "word")
    if form == 2:
        bags, per, friends = r.randint(2, 9), r.randint(3, 12), r.randint(2, 6)
        total = bags * per
        return (f"{name} has {bags} bags with {per} marbles in each and shares them as equally as possible "
                f"among {friends} friends, giving each friend the same whole number of marbles. How many "
                "marbles are left over?", total % friends, "word")
    young, gap, later = r.randint(5, 40), r.randint(1, 30), r.randint(1, 15)
    total = young + later + young + gap + later
    return (f"{name} is {gap} years older than a cousin. In {later} years the sum of their two ages will be "
            f"{total}. How old is the cousin now?", young, "word")


def _level5(r: Rng) -> tuple[str, int, str]:
    form = r.randint(0, 2)
    if form == 0:
        a, b, n = r.randint(2, 9), r.randint(10, 19), r.randint(100, 999)
        while b % a == 0:
            b += 1
        lcm = a * b // _gcd(a, b)
        return (f"How many integers from 1 to {n} are divisible by {a} or by {b}?",
                n // a + n // b - n // lcm, "counting")
    if form == 1:
        k, n = r.randint(3, 13), r.randint(50, 400)
        m = n // k
        return f"What is the sum of all positive multiples of {k} that are at most {n}?", k * m * (m + 1) // 2, "series"
    a, d, n, m = r.randint(1, 20), r.randint(2, 9), r.randint(10, 40), r.randint(7, 31)
    total = n * (2 * a + (n - 1) * d) // 2
    return (f"An arithmetic sequence starts at {a} and each term is {d} more than the one before. What is the "
            f"remainder when the sum of its first {n} terms is divided by {m}?", total % m, "series")


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


_LEVELS: tuple[Callable[[Rng], tuple[str, int, str]], ...] = (_level1, _level2, _level3, _level4, _level5)


def make_problem(split: str, index: int, attempt: int = 0) -> dict[str, Any]:
    """A DAPO-shaped row (`prompt` messages, `label`) plus id, level and topic for task `index` of `split`."""
    level = index % LEVELS + 1
    r = Rng.from_key(f"{GENERATOR_VERSION}/{split}/{index}/{attempt}")
    question, answer, topic = _LEVELS[level - 1](r)
    return {
        "task_id": f"arith-{split}-{index:04d}",
        "prompt": [{"role": "user", "content": f"{INSTRUCTION}\n\n{question}"}],
        "label": str(answer),
        "level": level,
        "topic": topic,
    }


def generate_split(split: str, avoid: set[str] | None = None) -> list[dict[str, Any]]:
    """Every problem of a split; a problem whose text is in `avoid` (or already used) is redrawn."""
    seen = set(avoid or ())
    rows = []
    for i in range(SPLIT_SIZES[split]):
        attempt = 0
        row = make_problem(split, i)
        while row["prompt"][0]["content"] in seen:
            attempt += 1
            row = make_problem(split, i, attempt)
        seen.add(row["prompt"][0]["content"])
        rows.append(row)
    return rows
