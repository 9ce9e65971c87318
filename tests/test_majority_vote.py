"""Majority voting over a task's samples (self-consistency), by hand: which answers count as one, who votes, how
a tie is broken, and `agentrl compare --score majority` on files whose vote and mean disagree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.play.eval_results import answer_key, majority_metrics, majority_score
from agentrl.testing.cli import run_cli

A = 'submit_schedule {"schedule": [1, 0, -1]}'
B = 'submit_schedule {"schedule": [0, 1, -1]}'


def _s(answer: str, score: float, failure: str | None = None) -> dict:
    return {"answer": answer, "score": score, "failure": failure}


def test_answer_key_ignores_key_order_spacing_and_integral_floats() -> None:
    assert answer_key('submit {"b": 1, "a": [1.0, 2]}') == answer_key('submit {"a":[1,2.0],"b":1.0}')
    assert answer_key('submit {"a": [1.5]}') != answer_key('submit {"a": [1]}')
    assert answer_key("  42 \n") == "42"
    assert answer_key('submit {"a": [1,') == 'submit {"a": [1,'  # not JSON: compared as text
    assert answer_key(None) == ""


def test_majority_score_takes_the_most_common_answer_not_the_best() -> None:
    # B is given twice (once spelled differently), A once with the better score: B's score wins the vote.
    record = {"samples": [_s(A, 1.0), _s(B, 0.7), _s(B.replace(", ", ","), 0.7)]}
    assert majority_score(record) == pytest.approx(0.7)
    assert majority_score(record, n=1) == pytest.approx(1.0)  # the first sample alone


def test_failed_and_empty_samples_do_not_vote() -> None:
    # Two truncated replies repeating B would outvote A; flagged or empty, they do not count.
    record = {"samples": [_s(B, 0.0, "truncated"), _s(B, 0.0, "truncated"), _s("", 0.0), _s(A, 0.9)]}
    assert majority_score(record) == pytest.approx(0.9)
    assert majority_score({"samples": [_s("", 0.0), _s(A, 0.0, "invalid_call")]}) == 0.0


def test_a_tie_goes_to_the_answer_given_first() -> None:
    assert majority_score({"samples": [_s(B, 0.2), _s(A, 1.0), _s(A, 1.0), _s(B, 0.2)]}) == pytest.approx(0.2)
    assert majority_score({"samples": [_s(A, 1.0), _s(B, 0.2)]}) == pytest.approx(1.0)


def test_majority_metrics_vote_over_the_fewest_samples_a_task_has() -> None:
    records = [{"samples": [_s(A, 1.0), _s(B, 0.5), _s(B, 0.5)]},  # first two: a tie, A first -> 1.0
               {"samples": [_s(B, 0.4), _s(B, 0.4)]}]
    assert majority_metrics(records, "eval") == {"eval/maj_at_2": pytest.approx((1.0 + 0.4) / 2)}
    assert majority_metrics([{"samples": [_s(A, 1.0)]}], "eval") == {}  # one sample: no vote to report


def test_majority_metrics_report_every_odd_k_and_the_whole_vote() -> None:
    # six samples: A, B, B, A, A, B; the first 3 vote B (0.2), the first 5 vote A (1.0), all 6 tie -> A (first)
    record = {"samples": [_s(A, 1.0), _s(B, 0.2), _s(B, 0.2), _s(A, 1.0), _s(A, 1.0), _s(B, 0.2)]}
    assert majority_metrics([record], "eval") == {"eval/maj_at_3": pytest.approx(0.2),
                                                   "eval/maj_at_5": pytest.approx(1.0),
                                                   "eval/maj_at_6": pytest.approx(1.0)}


def test_compare_score_majority_pairs_the_votes(tmp_path: Path) -> None:
    # d0: A's mean is (1 + 0.5 + 0.5) / 3 = 0.667, its vote 0.5; d1: mean 0.6, vote 0.9 (B twice).
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(json.dumps({"task_id": t, "split": "eval", "index": i, "samples": s}) for i, (t, s) in
                           enumerate({"d0": [_s(A, 1.0), _s(B, 0.5), _s(B, 0.5)],
                                      "d1": [_s(B, 0.9), _s(A, 0.0), _s(B, 0.9)]}.items())) + "\n")
    b = tmp_path / "b.jsonl"
    b.write_text("\n".join(json.dumps({"task_id": t, "split": "eval", "index": i, "samples": [_s(A, v)]})
                           for i, (t, v) in enumerate({"d0": 0.5, "d1": 0.5}.items())) + "\n")
    done = run_cli(["compare", str(a), str(b), "--score", "majority"], cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "A - B, paired by task: +0.2000 ± 0.2000 (1.0 se), n 2: won 1, lost 0, tied 1" in done.stdout
    assert "majority vote: 0.7000" in done.stdout
    mean = run_cli(["compare", str(a), str(b)], cwd=tmp_path, timeout=600)
    assert "A - B, paired by task: +0.1333" in mean.stdout  # the means: (0.667 - 0.5 + 0.6 - 0.5) / 2
    # several files on a side are each voted, then averaged per task
    both = run_cli(["compare", f"{a},{a}", str(b), "--score", "majority"], cwd=tmp_path, timeout=600)
    assert "A - B, paired by task: +0.2000 ± 0.2000" in both.stdout, both.stderr[-2000:]
