"""`python -m agentrl compare A B`: two eval results on the same tasks, paired task by task.

A and B are per-task results files (`evals/*.jsonl` in a run folder) or MLflow run ids (an `agentrl eval` run's
results, or a training run's last sampled eval); a side may be several of them joined by commas (one eval per
seed), averaged task by task, as the seed-mean claims in benchmarks/RESULTS.md are. Prints A - B: the paired
per-task mean difference ± its standard error, the tasks won, lost and tied, and the same by each breakdown fact
the files carry (e.g. GridSim's battery duration). Refuses two results whose task sets differ.

A sample is measured by its grade, the environment's own (`--measure grade`, the default), or by the reward
group's episode score that `eval/reward` averages (`--measure reward`; under reward=rubric the rubric's total);
files written before samples carried a grade hold only the score, which stands in for it. A task's score is the
mean of its samples'; with `--score majority`, that of the answer most of its samples gave (self-consistency: one agent given k samples a task, e.g. as many model tokens as a multi-agent
play spends; `eval/maj_at_<k>` in MLflow).
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.config.locate import project_root
from agentrl.paired import PairedDiff, mean_se, paired_diff
from agentrl.play.eval_results import EvalResultsError, majority_score, read_results, task_score
from agentrl.tracking.eval_lookup import RunLookupError, eval_results_of, looks_like_run_id
from agentrl.tracking.uri import resolve_tracking_uri

SCORERS = {"mean": task_score, "majority": majority_score}
# `--measure` -> the sample field it reads (eval_results.MEASURES): eval/reward averages each sample's `score`.
MEASURE_FIELDS = {"grade": "grade", "reward": "score"}


class CompareError(ValueError):
    """Two results that cannot be paired (the message names the tasks that differ)."""


def load(source: str, tracking_uri: str, scratch: Path) -> tuple[str, list[dict[str, Any]]]:
    """(a label, the records) of a results file or an MLflow run id."""
    path = Path(source)
    if path.is_file():
        return str(path), read_results(path)
    if looks_like_run_id(source):
        downloaded = eval_results_of(tracking_uri, source, scratch / source)
        return f"run {source} ({downloaded.name})", read_results(downloaded)
    raise CompareError(f"{source}: neither a per-task results file nor an MLflow run id")


def keyed(records: Sequence[Mapping[str, Any]], label: str) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Records by (split, task id); a task listed twice is refused."""
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in records:
        key = (str(r.get("split")), str(r["task_id"]))
        if key in out:
            raise CompareError(f"{label}: task {key[1]} (split {key[0]}) appears twice")
        out[key] = r
    return out


def same_tasks(ka: Mapping[tuple[str, str], Any], kb: Mapping[tuple[str, str], Any], labels: tuple[str, str]) -> None:
    """Refuse two keyed results whose task sets differ, naming (up to five of) the tasks only one side has."""
    if ka.keys() == kb.keys():
        return
    only_a, only_b = sorted(ka.keys() - kb.keys()), sorted(kb.keys() - ka.keys())

    def show(keys: list[tuple[str, str]]) -> str:
        return ", ".join(f"{t} ({s})" for s, t in keys[:5]) + (" ..." if len(keys) > 5 else "")

    parts = [f"{len(only_a)} only in {labels[0]}: {show(only_a)}" if only_a else "",
             f"{len(only_b)} only in {labels[1]}: {show(only_b)}" if only_b else ""]
    raise CompareError("the two results are not on the same tasks (" + "; ".join(p for p in parts if p) + ")")


def average(parts: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> tuple[str, list[dict[str, Any]]]:
    """Several results on the same tasks (e.g. one eval per seed) as one: each task's record carries one sample
    per part, scored with that part's task score, so the task's score is their mean."""
    (label0, first), rest = parts[0], parts[1:]
    base = keyed(first, label0)
    scores = {key: [task_score(r)] for key, r in base.items()}
    for label, records in rest:
        other = keyed(records, label)
        same_tasks(base, other, (label0, label))
        for key, r in other.items():
            scores[key].append(task_score(r))
    merged = [{**base[key], "samples": [{"score": s} for s in scores[key]]} for key in base]
    return f"the mean of {len(parts)} ({'; '.join(label for label, _ in parts)})", merged


def scored(records: Sequence[Mapping[str, Any]], score: str, measure: str = "grade") -> list[dict[str, Any]]:
    """The records with each task's samples replaced by one sample holding the task's score under `score`
    (`SCORERS`) of each sample's `measure` (`MEASURE_FIELDS`), which is then every later step's task score."""
    field = MEASURE_FIELDS[measure]
    return [{**r, "samples": [{"score": SCORERS[score](r, measure=field)}]} for r in records]


def load_side(spec: str, tracking_uri: str, scratch: Path, score: str = "mean",
              measure: str = "grade") -> tuple[str, list[dict[str, Any]]]:
    """One side of the comparison: a source, or several joined by commas, averaged task by task; each task
    scored as `score` says (`SCORERS`) on its samples' `measure` before the average."""
    sources = [s for s in spec.split(",") if s]
    if not sources:
        raise CompareError(f"{spec!r}: no results named")
    parts = [(label, scored(records, score, measure))
             for label, records in (load(s, tracking_uri, scratch) for s in sources)]
    return parts[0] if len(parts) == 1 else average(parts)


def pair(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *, labels: tuple[str, str] = ("A", "B"),
         ) -> tuple[PairedDiff, dict[str, PairedDiff], list[float], list[float]]:
    """A - B on the same tasks: the overall paired difference, the same per breakdown value (`fact=value`), and
    each side's per-task scores (the mean of its samples), in task order. Mismatched task sets are refused."""
    ka, kb = keyed(a, labels[0]), keyed(b, labels[1])
    same_tasks(ka, kb, labels)
    keys = sorted(ka, key=lambda k: (k[0], ka[k].get("index") if ka[k].get("index") is not None else -1, k[1]))
    sa, sb = [task_score(ka[k]) for k in keys], [task_score(kb[k]) for k in keys]
    groups: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        for fact, value in sorted((ka[k].get("facts") or {}).items()):
            groups[f"{fact}={value}"].append(i)
    by = {name: paired_diff([sa[i] for i in idx], [sb[i] for i in idx]) for name, idx in sorted(groups.items())}
    return paired_diff(sa, sb), by, sa, sb


def report(label_a: str, label_b: str, a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]],
           measure: str = "grade") -> str:
    """The comparison as printed: each side's mean `measure` ± se, then A - B overall and by breakdown value."""
    overall, by, sa, sb = pair(a, b, labels=(label_a, label_b))
    (ma, sea), (mb, seb) = mean_se(sa), mean_se(sb)
    lines = [f"A  {label_a}: {ma:.4f} ± {sea:.4f} over {len(sa)} tasks ({measure})",
             f"B  {label_b}: {mb:.4f} ± {seb:.4f} over {len(sb)} tasks ({measure})",
             f"A - B, paired by task: {overall.line()}"]
    lines += [f"  {name}: {d.line()}" for name, d in by.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`agentrl compare A B [--tracking-uri URI]`."""
    parser = argparse.ArgumentParser(prog="agentrl compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="per-task results file (evals/*.jsonl) or MLflow run id; several joined by "
                                  "commas (one per seed) are averaged task by task")
    parser.add_argument("b", help="the same for the other side (A - B is reported)")
    parser.add_argument("--score", choices=sorted(SCORERS), default="mean",
                        help="a task's score: the mean of its samples' (default), or the score of the answer most "
                             "of them gave (majority vote, both sides)")
    parser.add_argument("--measure", choices=sorted(MEASURE_FIELDS), default="grade",
                        help="what a sample is measured by: the environment's own grade (default), or the reward "
                             "group's score that eval/reward averages (under reward=rubric the rubric's total)")
    parser.add_argument("--tracking-uri", default=None,
                        help="the MLflow store run ids are read from (default: $MLFLOW_TRACKING_URI, else the "
                             "project's outputs/mlflow.db)")
    args = parser.parse_args(argv)
    uri = resolve_tracking_uri(args.tracking_uri, project_root() / "outputs")
    try:
        with tempfile.TemporaryDirectory(prefix="agentrl-compare-") as scratch:
            (la, a), (lb, b) = (load_side(s, uri, Path(scratch), args.score, args.measure) for s in (args.a, args.b))
            if args.score != "mean":
                la, lb = f"{la}, {args.score} vote", f"{lb}, {args.score} vote"
            print(report(la, lb, a, b, args.measure), flush=True)
    except (CompareError, EvalResultsError, RunLookupError) as err:
        raise SystemExit(f"agentrl compare: {err}") from None
    return 0
