"""Integer problems a small model cannot do in its head but can with a calculator, each a pure function of
(split, index, attempt).

Four kinds (`add`, `mul`, `div`, `word`) take turns by index, and three levels within each kind, so any
multiple of 12 tasks holds every (kind, level) equally. Each row keeps the expression that solves it in one
`calculate` call: the teacher's call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.envs.seeded_rng import Rng

GENERATOR_VERSION = "calc-v1"
SPLIT_SIZES = {"train": 2000, "eval": 100}
KINDS = ("add", "mul", "div", "word")
LEVELS = 3

Problem = tuple[str, str, int]  # question, expression, answer


def _add(r: Rng, level: int) -> Problem:
    if level == 1:
        a, b = r.randint(1000, 9999), r.randint(1000, 9999)
        return f"What is {a} + {b}?", f"{a} + {b}", a + b
    if level == 2:
        a, b, c = r.randint(1000, 9999), r.randint(1000, 9999), r.randint(100, 999)
        return f"What is {a} + {b} - {c}?", f"{a} + {b} - {c}", a + b - c
    a, b, c, d = r.randint(10000, 99999), r.randint(1000, 9999), r.randint(1000, 9999), r.randint(100, 999)
    return f"What is {a} - {b} + {c} - {d}?", f"{a} - {b} + {c} - {d}", a - b + c - d


def _mul(r: Rng, level: int) -> Problem:
    if level == 1:
        a, b = r.randint(13, 99), r.randint(13, 99)
        return f"What is {a} * {b}?", f"{a} * {b}", a * b
    a, b = r.randint(101, 999), r.randint(13, 99)
    if level == 2:
        return f"What is {a} * {b}?", f"{a} * {b}", a * b
    c = r.randint(100, 999)
    return f"What is {a} * {b} + {c}?", f"{a} * {b} + {c}", a * b + c


def _div(r: Rng, level: int) -> Problem:
    # Exact divisions: the dividend is made as quotient * divisor.
    d, q = (r.randint(3, 9) if level == 1 else r.randint(13, 99)), r.randint(101, 999)
    if level < 3:
        return f"What is {q * d} / {d}?", f"{q * d} / {d}", q
    b = r.randint(100, 999)
    return f"What is ({q * d - b} + {b}) / {d}?", f"({q * d - b} + {b}) / {d}", q


# (container, its plural, item): "A box holds 24 eggs."
_HOLDERS = (("box", "boxes", "eggs"), ("crate", "crates", "bottles"), ("shelf", "shelves", "books"),
            ("bag", "bags", "apples"), ("bus", "buses", "people"), ("page", "pages", "words"),
            ("row", "rows", "seats"), ("tray", "trays", "cookies"))


def _word(r: Rng, level: int) -> Problem:
    holder, plural, item = r.choice(_HOLDERS)
    per, n = r.randint(12, 96), r.randint(101, 999)
    if level == 1:
        return f"A {holder} holds {per} {item}. How many {item} are in {n} {plural}?", f"{per} * {n}", per * n
    if level == 2:
        extra = r.randint(2, per - 1)
        return (f"A {holder} holds {per} {item}. How many {item} are in {n} full {plural} and {extra} more?",
                f"{per} * {n} + {extra}", per * n + extra)
    return (f"There are {per * n} {item}, {per} in each {holder}. How many {plural} are there?",
            f"{per * n} / {per}", n)


_MAKERS: dict[str, Callable[[Rng, int], Problem]] = {"add": _add, "mul": _mul, "div": _div, "word": _word}


def make_problem(split: str, index: int, attempt: int = 0) -> dict[str, Any]:
    """Task `index` of `split`: its question, the one-call expression, the answer, kind and level."""
    kind = KINDS[index % len(KINDS)]
    level = (index // len(KINDS)) % LEVELS + 1
    r = Rng.from_key(f"{GENERATOR_VERSION}/{split}/{index}/{attempt}")
    question, expression, answer = _MAKERS[kind](r, level)
    return {"task_id": f"calc-{split}-{index:04d}", "question": question, "expression": expression,
            "answer": str(answer), "kind": kind, "level": level}


def generate_split(split: str, avoid: set[str] | None = None, size: int | None = None) -> list[dict[str, Any]]:
    """Every problem of a split; a question in `avoid` (or already used) is redrawn."""
    seen = set(avoid or ())
    rows = []
    for i in range(SPLIT_SIZES[split] if size is None else size):
        attempt = 0
        row = make_problem(split, i)
        while row["question"] in seen:
            attempt += 1
            row = make_problem(split, i, attempt)
        seen.add(row["question"])
        rows.append(row)
    return rows
