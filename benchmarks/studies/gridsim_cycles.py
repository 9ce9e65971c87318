"""How many charge/sell cycles a GridSim model's schedules make, against each day's best single cycle.

    python benchmarks/studies/gridsim_cycles.py EVAL.jsonl[.gz] [EVAL ...]

Reads per-task eval files (`agentrl eval`'s evals/eval.jsonl, or a run's evals/eval-step-<n>.jsonl) of a stored
GridSim split and prints, per battery duration: the samples' mean score, the mean score of each day's best single
cycle (selling at most D hours: the ceiling of a policy that never cycles twice), the share of samples at that
ceiling, and the samples' cycles (hours sold / D) as shares of none, part of one, one, and more than one. The
optimum cycles about twice a day on 1-2 h batteries (benchmarks/RESULTS.md, "Issue 33, proof 1").
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.envs.bundles.gridsim.battery import HOURS
from agentrl.play.eval_results import read_results

SHAPES = ("none", "part", "one", "more")  # hours sold: 0, 1..D-1, D, > D


def schedule_of(answer: Any) -> list[int] | None:
    """The schedule of a `submit_schedule {"schedule": [...]}` answer; None when it holds no 24-hour schedule."""
    _, _, rest = str(answer or "").partition(" ")
    try:
        schedule = json.loads(rest).get("schedule")
    except (ValueError, AttributeError):
        return None
    ok = isinstance(schedule, list) and len(schedule) == HOURS and all(x in (-1, 0, 1) for x in schedule)
    return schedule if ok else None


def shape(schedule: list[int], duration_h: int) -> str:
    """The schedule's cycles as one of SHAPES."""
    sold = schedule.count(-1)
    return "none" if sold == 0 else "part" if sold < duration_h else "one" if sold == duration_h else "more"


def profile(records: Iterable[Mapping[str, Any]], rows: Mapping[tuple[str, int], Mapping[str, Any]]
            ) -> dict[str, dict[str, float]]:
    """Per duration (`1h`, ...) and `all`: samples, mean score, the best single cycle's mean, the share of samples
    at it, the share of each shape among parsed schedules, the share unparsed, and the mean score of `more`."""
    from agentrl.envs.bundles.gridsim.battery import UNITS_PER_USD, Battery, best_single_cycle, score
    from agentrl.envs.bundles.gridsim.tasks import cents_of

    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        key = (str(record.get("split")), int(record.get("index", -1)))
        if key not in rows:
            raise ValueError(f"{record.get('task_id')}: no stored GridSim day {key[0]}/{key[1]}")
        row = rows[key]
        battery = Battery.from_json(row["battery"])
        best = int(round(row["optimal_profit"] * UNITS_PER_USD))
        ceiling = score(best_single_cycle(cents_of(row), battery), best)
        for group in (f"{battery.duration_h}h", "all"):
            a = acc[group]
            for sample in record["samples"]:
                a["score"].append(sample["score"])
                a["ceiling"].append(ceiling)
                a["at_ceiling"].append(float(sample["score"] >= ceiling - 1e-6))
                schedule = schedule_of(sample.get("answer"))
                a["unparsed"].append(float(schedule is None))
                if schedule is not None:
                    kind = shape(schedule, battery.duration_h)
                    for s in SHAPES:
                        a[s].append(float(kind == s))
                    if kind == "more":
                        a["more_score"].append(sample["score"])
    order = sorted((g for g in acc if g != "all"), key=lambda g: int(g[:-1])) + ["all"]
    out = {}
    for group in order:
        a = acc[group]
        out[group] = {"samples": float(len(a["score"])),
                      **{k: sum(v) / len(v) if v else float("nan") for k, v in a.items()}}
    return out


def table(prof: Mapping[str, Mapping[str, float]], title: str) -> str:
    """The profile as plain text, one row per duration."""
    cols = ("samples", "score", "ceiling", "at_ceiling", "unparsed", *SHAPES, "more_score")
    lines = [title, f"{'group':<6}" + "".join(f"{c:>11}" for c in cols)]
    for group, p in prof.items():
        lines.append(f"{group:<6}" + "".join(f"{p.get(c, float('nan')):>11.0f}" if c == "samples"
                                             else f"{p.get(c, float('nan')):>11.3f}" for c in cols))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="per-task eval files of stored GridSim days")
    args = parser.parse_args()
    from agentrl.envs.bundles import load_bundle

    bundle = load_bundle("gridsim")
    rows = {(split, i): row for split in ("train", "eval") for i, row in enumerate(bundle.rows(split))}
    for path in args.files:
        print(table(profile(read_results(path), rows), str(path)))


if __name__ == "__main__":
    main()
