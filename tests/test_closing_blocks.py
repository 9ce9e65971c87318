"""What the end of a run and of an evaluation print: the environment's grade (with the shaped reward beside it only
when a reward group makes it differ) on a named subset of tasks, the tool-call rate and failure kinds, and a
resume command that carries AGENTRL_HOME when it was set."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.eval_run import closing_block as eval_block
from agentrl.run import final_scores
from agentrl.tracking.tracker import continue_line

SUBSET = "40 of 200 tasks, stratified by duration_h"


def _results(path: Path, samples: list[dict[str, float]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"task_id": f"d{i}", "split": "eval", "index": i, "samples": [s]}) + "\n"
                            for i, s in enumerate(samples)))
    return path


def test_a_rubric_runs_block_leads_with_the_grade_and_names_the_shaped_reward(tmp_path: Path) -> None:
    # reward=rubric: the samples' score is the rubric's total, the grade the env's own
    _results(tmp_path / "evals" / "eval-step-2.jsonl", [{"score": 1.0}])  # an older eval: not the last
    _results(tmp_path / "evals" / "eval-step-20.jsonl", [{"score": 0.9, "grade": 0.5}, {"score": 0.7, "grade": 0.0}])
    _results(tmp_path / "evals" / "eval_greedy-step-20.jsonl", [{"score": 1.0, "grade": 1.0}, {"score": 0.6, "grade": 0.25}])
    lines = final_scores({"eval/reward": 0.8, "eval_greedy/reward": 0.8}, tmp_path, SUBSET)
    assert lines == [f"final eval/grade   0.250 sampled, 0.625 greedy-decoded ({SUBSET})",
                     "final eval/reward  0.800 sampled, 0.800 greedy-decoded (the reward group's score, shaped)"]


def test_where_grade_and_reward_agree_one_line_and_old_files_read_their_score(tmp_path: Path) -> None:
    _results(tmp_path / "evals" / "eval-step-5.jsonl", [{"score": 0.5}, {"score": 0.25}])  # no grade: written before
    assert final_scores({"eval/reward": 0.375}, tmp_path, SUBSET) == [f"final eval/grade   0.375 sampled ({SUBSET})"]
    # no per-task file (a trainer that writes none): the trainer's eval/reward alone, no subset claimed
    assert final_scores({"eval/reward": 0.375}, tmp_path / "none", SUBSET) == ["final eval/reward  0.375 sampled"]
    assert final_scores({}, tmp_path, SUBSET) == []


def test_the_eval_block_reports_grade_tool_calls_and_failures() -> None:
    tracker = SimpleNamespace(run_id=None)
    metrics = {"eval/grade": 0.25, "eval/grade_stderr": 0.05, "eval/reward": 0.64, "eval/reward_stderr": 0.04,
               "eval/zero_share": 0.5, "eval/tool_call_rate": 0.0, "eval/tool_calls_per_play": 0.0,
               "eval/failure_share": 0.75, "eval/failure/truncated": 0.5, "eval/failure/max_turns": 0.25,
               "eval/reward_1h": 0.7}
    block = eval_block(status="FINISHED", run_dir=Path("/r"), tracker=tracker, metrics=metrics, subset=SUBSET,
                       samples=1, results=None, wall_s=3.0).splitlines()
    assert f"eval/grade    0.2500 ± 0.0500 ({SUBSET} x 1 sample) (the environment's own grade)" in block
    assert "eval/reward   0.6400 ± 0.0400 (the reward group's score, shaped)" in block
    assert "tool calls    0% of plays made a valid tool call (0.00 a play)" in block  # an untrained model, said so
    assert "failures      failed 75% (truncated 50%, max_turns 25%)" in block
    assert "breakdown     reward_1h 0.700" in block
    same = eval_block(status="FINISHED", run_dir=Path("/r"), tracker=tracker, samples=4, results=None, wall_s=3.0,
                      metrics={**metrics, "eval/reward": 0.25, "eval/failure_share": 0.0}, subset="all 200 tasks")
    assert "eval/reward" not in same.replace("eval/reward_", "") and "failures      none" in same
    assert "(all 200 tasks x 4 samples)" in same


def test_the_resume_command_carries_agentrl_home_when_it_was_set(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "my home"
    monkeypatch.setenv("AGENTRL_HOME", str(home))
    line = continue_line(["+recipe=gridsim_grpo", "trainer.resume=old"], "abc", resumable=True)
    assert line == (f"resume it     AGENTRL_HOME={shlex.quote(str(home.resolve()))} python -m agentrl "
                    "+recipe=gridsim_grpo trainer.resume=abc")
    assert continue_line([], "abc", resumable=False).startswith(f"rerun it      AGENTRL_HOME={shlex.quote(str(home))} ")
    monkeypatch.delenv("AGENTRL_HOME")
    assert continue_line(["x=1"], "abc", resumable=True) == "resume it     python -m agentrl x=1 trainer.resume=abc"
