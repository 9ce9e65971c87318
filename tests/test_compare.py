"""`python -m agentrl compare A B` on two known per-task result files: the hand-computed paired mean and se, the
breakdown, and a clear refusal of mismatched task sets or a file that is not a results file; on two `agentrl eval`
runs of the same model and tasks, exactly 0 ± 0 with every task tied, and a refusal when the tasks differ."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl, run_cli


def _write(path: Path, tasks: dict[str, list[float]], hours: dict[str, int]) -> Path:
    with path.open("w") as out:
        for i, (task, scores) in enumerate(tasks.items()):
            out.write(json.dumps({"task_id": task, "split": "eval", "index": i, "facts": {"duration_h": hours[task]},
                                  "samples": [{"score": s, "reward": s} for s in scores]}) + "\n")
    return path


HOURS = {"d0": 1, "d1": 1, "d2": 4, "d3": 4}


def test_compare_two_files_by_hand(tmp_path: Path) -> None:
    # A's task scores are its samples' means: 0.5, 1.0, 0.2, 0.9; B's 0.3, 1.0, 0.4, 0.5 (listed in another order).
    a = _write(tmp_path / "a.jsonl", {"d0": [0.25, 0.75], "d1": [1.0, 1.0], "d2": [0.2, 0.2], "d3": [0.9, 0.9]}, HOURS)
    b = _write(tmp_path / "b.jsonl", {"d3": [0.5], "d1": [1.0], "d0": [0.3], "d2": [0.4]}, HOURS)
    done = run_cli(["compare", str(a), str(b)], cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    se = math.sqrt(0.2 / 3 / 4)  # diffs 0.2, 0, -0.2, 0.4: mean 0.1
    assert f"A - B, paired by task: +0.1000 ± {se:.4f} ({0.1 / se:.1f} se), n 4: won 2, lost 1, tied 1" in done.stdout
    # by battery duration: 1h diffs 0.2, 0 (mean 0.1, se 0.1); 4h diffs -0.2, 0.4 (mean 0.1, se 0.3)
    assert "duration_h=1: +0.1000 ± 0.1000 (1.0 se), n 2: won 1, lost 0, tied 1" in done.stdout
    assert "duration_h=4: +0.1000 ± 0.3000 (0.3 se), n 2: won 1, lost 1, tied 0" in done.stdout
    assert "over 4 tasks" in done.stdout
    # the same results kept gzip-compressed (as benchmarks/data keeps them) compare the same; a broken one is named
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(a.read_bytes()))
    done = run_cli(["compare", str(tmp_path / "a.jsonl.gz"), str(b)], cwd=tmp_path, timeout=600)
    assert f"A - B, paired by task: +0.1000 ± {se:.4f}" in done.stdout, done.stderr[-3000:]
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    done = run_cli(["compare", str(tmp_path / "bad.jsonl.gz"), str(b)], cwd=tmp_path, timeout=600)
    assert done.returncode != 0 and "bad.jsonl.gz: not a readable per-task results file" in done.stderr
    assert "Traceback" not in done.stderr


def test_compare_refuses_mismatched_tasks(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", {"d0": [0.5], "d1": [1.0], "d2": [0.2]}, HOURS)
    b = _write(tmp_path / "b.jsonl", {"d0": [0.3], "d1": [1.0], "d3": [0.4]}, HOURS)
    done = run_cli(["compare", str(a), str(b)], cwd=tmp_path, timeout=600)
    assert done.returncode != 0
    assert "not on the same tasks" in done.stderr
    assert "1 only in" in done.stderr and "d2 (eval)" in done.stderr and "d3 (eval)" in done.stderr
    assert "Traceback" not in done.stderr


def test_compare_averages_a_side_of_several_results(tmp_path: Path) -> None:
    # Three "seeds" on A: task means d0 (0.2+0.5+0.8)/3 = 0.5, d1 1.0, d2 (0.1+0.2+0.3)/3 = 0.2, d3 0.9 (one seed
    # has two samples, 0.8 and 1.0: its task score 0.9); B as in the first test: the same +0.1000 difference.
    s1 = _write(tmp_path / "s1.jsonl", {"d0": [0.2], "d1": [1.0], "d2": [0.1], "d3": [0.9]}, HOURS)
    s2 = _write(tmp_path / "s2.jsonl", {"d0": [0.5], "d1": [1.0], "d2": [0.2], "d3": [0.8, 1.0]}, HOURS)
    s3 = _write(tmp_path / "s3.jsonl", {"d3": [0.9], "d2": [0.3], "d1": [1.0], "d0": [0.8]}, HOURS)
    b = _write(tmp_path / "b.jsonl", {"d3": [0.5], "d1": [1.0], "d0": [0.3], "d2": [0.4]}, HOURS)
    done = run_cli(["compare", f"{s1},{s2},{s3}", str(b)], cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    se = math.sqrt(0.2 / 3 / 4)
    assert f"A - B, paired by task: +0.1000 ± {se:.4f} ({0.1 / se:.1f} se), n 4: won 2, lost 1, tied 1" in done.stdout
    assert "A  the mean of 3 (" in done.stdout and "0.6500 ± " in done.stdout  # (0.5 + 1 + 0.2 + 0.9) / 4
    # one seed on other tasks is refused, naming it
    odd = _write(tmp_path / "odd.jsonl", {"d0": [0.5], "d1": [1.0], "d2": [0.2], "d9": [0.9]},
                 {**HOURS, "d9": 1})
    done = run_cli(["compare", f"{s1},{odd}", str(b)], cwd=tmp_path, timeout=600)
    assert done.returncode != 0 and "not on the same tasks" in done.stderr and "d9 (eval)" in done.stderr
    assert "Traceback" not in done.stderr


def test_compare_names_a_bad_source(tmp_path: Path) -> None:
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"no": "task id"}\n')
    good = _write(tmp_path / "a.jsonl", {"d0": [0.5]}, HOURS)
    done = run_cli(["compare", str(junk), str(good)], cwd=tmp_path, timeout=600)
    assert done.returncode != 0 and f"{junk} line 1: not a per-task eval record" in done.stderr
    done = run_cli(["compare", str(tmp_path / "missing.jsonl"), str(good)], cwd=tmp_path, timeout=600)
    assert done.returncode != 0 and "neither a per-task results file nor an MLflow run id" in done.stderr
    assert "Traceback" not in done.stderr


EVAL = ["eval", "eval.samples=2", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024", "agent.max_response_tokens=24"]


@pytest.mark.slow
def test_two_evals_of_the_same_model_and_tasks_compare_to_exactly_zero(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first, again = (run_agentrl([*EVAL, "eval.limit=3"], home).mlflow_run().info.run_id for _ in range(2))
    assert first != again
    done = run_agentrl(["compare", first, again], home, seed_model=False)
    # Sampled at the trainer's temperature, seeded: the same plays, so every task ties.
    assert "A - B, paired by task: +0.0000 ± 0.0000 (0.0 se), n 3: won 0, lost 0, tied 3" in done.stdout
    # The first run against its own results less one task: refused, naming the task only the run has.
    own = sorted((home / "outputs" / "runs" / "eval").glob("*/evals/eval.jsonl"))  # the two runs' equal files
    lines = own[0].read_text().splitlines()
    assert len(own) == 2 and len(lines) == 3
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("\n".join(lines[:-1]) + "\n")
    refused = run_agentrl(["compare", first, str(fewer)], home, seed_model=False, check=False)
    assert refused.process.returncode != 0 and "not on the same tasks (1 only in" in refused.process.stderr
    assert "Traceback" not in refused.process.stderr


def test_compare_measures_the_grade_unless_told_the_reward(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from agentrl.compare import main

    # reward=rubric runs: each sample's score is the rubric's total, its grade the env's own
    def write(path: Path, samples: list[tuple[float, float]]) -> Path:
        path.write_text("".join(json.dumps({"task_id": f"d{i}", "split": "eval", "index": i,
                                            "samples": [{"score": score, "grade": grade, "reward": score}]}) + "\n"
                                for i, (score, grade) in enumerate(samples)))
        return path

    a = write(tmp_path / "a.jsonl", [(0.9, 0.5), (0.9, 0.25)])
    b = write(tmp_path / "b.jsonl", [(0.5, 0.5), (0.6, 0.75)])
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out  # grades: A 0.5, 0.25 against B 0.5, 0.75
    assert "0.3750 ± 0.1250 over 2 tasks (grade)" in out and "0.6250 ± 0.1250 over 2 tasks (grade)" in out
    assert "A - B, paired by task: -0.2500 ± 0.2500 (-1.0 se), n 2: won 0, lost 1, tied 1" in out
    assert main([str(a), str(b), "--measure", "reward"]) == 0
    out = capsys.readouterr().out  # the rubric's totals: 0.9, 0.9 against 0.5, 0.6
    assert "0.9000 ± 0.0000 over 2 tasks (reward)" in out
    assert "A - B, paired by task: +0.3500 ± 0.0500 (7.0 se), n 2: won 2, lost 0, tied 0" in out
