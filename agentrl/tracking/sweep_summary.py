"""A sweep's children as one table, and which of them is best: what the parent run keeps and the console prints."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

OBJECTIVE = "eval/reward"  # what run() returns, so what a sweeper optimizes
_COLUMNS = ("job", "run name", "status", OBJECTIVE, "eval_greedy/reward", "run id")


@dataclass(frozen=True)
class Child:
    """One job of a sweep as its MLflow run shows it."""

    job: int | None
    name: str
    status: str
    objective: float | None
    greedy: float | None
    run_id: str


def _finite(metrics: dict[str, float], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if value is not None and math.isfinite(float(value)) else None


def children_of(runs: list[Any], job_tag: str) -> list[Child]:
    """The sweep's child runs, in job order (runs without a job number last, by name)."""
    out = []
    for run in runs:
        job = run.data.tags.get(job_tag, "")
        out.append(Child(job=int(job) if job.isdigit() else None, name=run.info.run_name or "",
                         status=run.info.status, objective=_finite(run.data.metrics, OBJECTIVE),
                         greedy=_finite(run.data.metrics, "eval_greedy/reward"), run_id=run.info.run_id))
    return sorted(out, key=lambda c: (c.job is None, c.job or 0, c.name))


def best_child(children: list[Child], direction: str = "maximize") -> Child | None:
    """The finished child with the best objective (`direction`: maximize or minimize); None if none has one."""
    scored = [c for c in children if c.objective is not None and c.status == "FINISHED"]
    if not scored:
        return None
    pick = min if direction == "minimize" else max
    return pick(scored, key=lambda c: c.objective)


def _cell(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def rows(children: list[Child]) -> list[list[str]]:
    """The table's rows as text, one per child, in the columns of `columns()`."""
    return [[str(c.job) if c.job is not None else "-", c.name, c.status, _cell(c.objective), _cell(c.greedy),
             c.run_id] for c in children]


def columns() -> tuple[str, ...]:
    return _COLUMNS


def render(children: list[Child], best: Child | None, direction: str = "maximize") -> str:
    """The sweep's summary as printed at its end: one line per job, the best marked with `*`."""
    table = [list(_COLUMNS)] + rows(children)
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
    lines = [f"== agentrl sweep: {len(children)} jobs"]
    for i, row in enumerate(table):
        mark = "*" if best is not None and i > 0 and children[i - 1].run_id == best.run_id else " "
        lines.append(f"{mark} " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if best is not None:
        lines.append(f"best ({direction} {OBJECTIVE}): {best.name}  {OBJECTIVE} {best.objective:.4f}  "
                     f"run {best.run_id}")
    else:
        lines.append(f"best: none (no finished job logged {OBJECTIVE})")
    return "\n".join(lines)
