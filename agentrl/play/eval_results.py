"""Per-task eval results: one JSON Lines record per task (its samples' scores, rewards, tokens, tool calls and
answers), written into the run folder (`evals/<name>.jsonl`) and logged to the tracker with a per-sample table.

Training's evals and `agentrl eval` write the same file; `agentrl compare` reads two of them back. Plain dicts, so
the file is readable without agentrl.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.agents.record import Rollout
from agentrl.paired import pass_at_k

EVALS_DIR = "evals"  # under the run folder, and the artifact folder in the tracker


class EvalResultsError(ValueError):
    """A per-task results file that cannot be read (named in the message)."""


def prompt_of(row: Mapping[str, Any]) -> str:
    """The task's opening user message (what the table's prompt column shows)."""
    users = [m.get("content", "") for m in row.get("messages", []) if m.get("role") == "user"]
    return str(users[0]) if users else ""


def sample_record(r: Rollout) -> dict[str, Any]:
    """One sample of a task: its score (what evals read), trained reward, counts, final answer and failure."""
    out: dict[str, Any] = {"score": r.score, "grade": r.grade, "reward": r.reward,
                           "completion_tokens": r.completion_tokens,
                           "turns": r.turns, "tool_calls": r.tool_calls, "invalid_calls": r.invalid_calls,
                           "answer": r.answer, "failure": r.failure.value if r.failure else None}
    if r.details:  # pattern-specific facts (a judged play's selection, ...), when JSON can hold them
        out["details"] = json.loads(json.dumps(r.details, default=str))
    return out


def task_records(per_task: Sequence[Sequence[Rollout]], breakdown: Mapping[str, str] | None = None,
                 step: int | None = None) -> list[dict[str, Any]]:
    """One record per task from its samples' outcome rollouts (all of one row): task id, split, index, the
    bundle's breakdown facts (`Bundle.eval_breakdown`'s keys), the prompt and each sample."""
    records = []
    for samples in per_task:
        if not samples:
            continue
        meta = samples[0].row.get("metadata", {})
        task = meta.get("task") or {}
        records.append({"task_id": str(meta.get("task_id", meta.get("index"))), "split": meta.get("split"),
                        "index": meta.get("index"), "step": step,
                        "facts": {fact: task[fact] for fact in (breakdown or {}) if fact in task},
                        "prompt": prompt_of(samples[0].row), "samples": [sample_record(r) for r in samples]})
    return records


# What a sample is measured by: `grade` (the env's own grade, the default everywhere it is compared) or `score`
# (the reward group's episode score: what eval/reward averages; under reward=rubric the rubric's total).
MEASURES = ("grade", "score")


def sample_value(sample: Mapping[str, Any], measure: str = "grade") -> float:
    """A sample's `measure` (`MEASURES`). Files written before samples carried a grade hold only `score`, which
    was the grade under every reward but rubric: it stands in."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, not {measure!r}")
    value = sample.get(measure)
    return float(sample["score"] if value is None else value)


def task_score(record: Mapping[str, Any], measure: str = "grade") -> float:
    """A task's score: the mean of its samples' `measure` (the env's grade by default)."""
    scores = [sample_value(s, measure) for s in record["samples"]]
    return sum(scores) / len(scores)


def pass_metrics(records: Sequence[Mapping[str, Any]], pass_score: float, prefix: str) -> dict[str, float]:
    """`<prefix>/pass_at_<k>` (pass@k) for k = 1 .. the fewest samples a task has: the mean over tasks of the
    unbiased pass@k, a sample passing when its grade (the env's) >= `pass_score`."""
    if not records:
        return {}
    n_min = min(len(r["samples"]) for r in records)
    out = {}
    for k in range(1, n_min + 1):
        values = [pass_at_k(len(r["samples"]), sum(sample_value(s) >= pass_score for s in r["samples"]), k)
                  for r in records]
        out[f"{prefix}/pass_at_{k}"] = sum(values) / len(values)
    return out


def answer_key(answer: Any) -> str:
    """An answer as majority voting compares it: a tool call `name {json}` with its arguments serialized again
    (key order and spacing ignored, as `1` and `1.0` are equal), any other answer stripped of outer whitespace."""
    text = str(answer or "").strip()
    name, _, rest = text.partition(" ")
    if rest.startswith("{"):
        try:
            arguments = json.loads(rest, parse_float=_integral)
        except ValueError:
            return text
        return f"{name} {json.dumps(arguments, sort_keys=True, separators=(',', ':'))}"
    return text


def _integral(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() else value


def majority_score(record: Mapping[str, Any], n: int | None = None, measure: str = "grade") -> float:
    """A task's majority-vote score (self-consistency, Wang et al. 2022) over its first `n` samples (all when
    None): the `measure` (the env's grade by default) of the answer most of them gave. Samples with a failure or no answer do not vote; a tie goes
    to the tied answer given first (never to the better-scored one: the vote sees no grades); no vote scores 0."""
    votes: dict[str, list[float]] = {}
    for s in record["samples"][:n]:
        if s.get("failure") or not str(s.get("answer") or "").strip():
            continue
        votes.setdefault(answer_key(s["answer"]), []).append(sample_value(s, measure))
    if not votes:
        return 0.0
    most = max(len(v) for v in votes.values())
    scores = next(v for v in votes.values() if len(v) == most)  # dicts keep first-given order
    return sum(scores) / len(scores)  # one answer, one grade; the mean guards a grader that is not deterministic


def majority_metrics(records: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """`<prefix>/maj_at_<k>` for k = 3, 5, 7, ... up to n, the fewest samples a task has, and n itself (at least 2):
    the mean over tasks of `majority_score` over each task's first k samples. (An even k below n adds nothing: its
    ties go to the first answer, so maj@2 is the first sample's score.)"""
    if not records:
        return {}
    n = min(len(r["samples"]) for r in records)
    if n < 2:
        return {}
    ks = sorted({*range(3, n + 1, 2), n})
    return {f"{prefix}/maj_at_{k}": sum(majority_score(r, k) for r in records) / len(records) for k in ks}


def table_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The eval table: one row per sample. Its columns in this order, as MLflow's artifact view draws them, so
    the numbers are on the first screen and the long texts last: task id, grade, score, reward, failure, tool
    calls, invalid calls, completion tokens, sample, split, prompt, completion."""
    return [{"task_id": r["task_id"], "grade": sample_value(s), "score": s["score"], "reward": s["reward"],
             "failure": s["failure"] or "", "tool_calls": s["tool_calls"], "invalid_calls": s["invalid_calls"],
             "completion_tokens": s["completion_tokens"], "sample": j, "split": r["split"],
             "prompt": r["prompt"], "completion": s["answer"]}
            for r in records for j, s in enumerate(r["samples"])]


def write_results(path: Path, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write `records` as JSON Lines at `path` (its folder made); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for record in records:
            out.write(json.dumps(record, default=str) + "\n")
    return path


def read_results(path: Path) -> list[dict[str, Any]]:
    """The records of a per-task results file (gzip-compressed when it ends in .gz, as results kept in a repository
    are), each checked for a task id and a non-empty list of scored samples."""
    if not path.is_file():
        raise EvalResultsError(f"{path}: no such per-task results file")
    try:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise EvalResultsError(f"{path}: not a readable per-task results file ({exc})") from None
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "task_id" not in record:
                raise ValueError("no task_id")
            if not record.get("samples") or not all(isinstance(s.get("score"), int | float) for s in record["samples"]):
                raise ValueError("no scored samples")
        except (ValueError, AttributeError, TypeError) as exc:
            raise EvalResultsError(f"{path} line {number}: not a per-task eval record ({exc})") from None
        records.append(record)
    if not records:
        raise EvalResultsError(f"{path}: holds no task records")
    return records


def results_mean(path: Path, measure: str = "grade") -> float | None:
    """The mean `measure` over every sample of a per-task results file (what its eval logged as `eval/<measure>`,
    `score` being eval/reward's); None when the file cannot be read."""
    try:
        values = [sample_value(s, measure) for r in read_results(path) for s in r["samples"]]
    except EvalResultsError:
        return None
    return sum(values) / len(values)


def latest_results(run_dir: Path, prefix: str = "eval") -> Path | None:
    """The run folder's newest `<prefix>-step-<n>.jsonl` (the highest n), None when it has none."""
    found = [(int(p.stem.rsplit("-", 1)[1]), p) for p in (run_dir / EVALS_DIR).glob(f"{prefix}-step-*.jsonl")
             if p.stem.rsplit("-", 1)[1].isdigit()]
    return max(found)[1] if found else None


@dataclass
class EvalSink:
    """Where an evaluation's per-task results go: `<run_dir>/evals/<name>.jsonl`, logged to `tracker` as an
    artifact (under `evals/`) and as the eval table (`evals/<name>_table.json`). `last` is the newest file."""

    tracker: Any
    run_dir: Path
    last: Path | None = None

    def __call__(self, name: str, records: Sequence[Mapping[str, Any]]) -> Path:
        path = write_results(self.run_dir / EVALS_DIR / f"{name}.jsonl", records)
        if self.tracker is not None:
            publish(self.tracker, path, records)
        self.last = path
        return path


def publish(tracker: Any, path: Path, records: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Log a per-task results file to `tracker`: the file (under `evals/`) and its table
    (`evals/<name>_table.json`); `records` are read back from `path` when not given."""
    tracker.log_artifact(path, EVALS_DIR)
    tracker.log_table(table_rows(read_results(path) if records is None else records),
                      f"{EVALS_DIR}/{path.stem}_table.json")
