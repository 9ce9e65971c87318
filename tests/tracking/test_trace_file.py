"""Episode traces through a file (an accelerate rank's, logged by the parent): what a `TraceFile` writes reads
back as the same traces; a torn last line is skipped, a bad line elsewhere is refused naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.tracking.trace_file import TraceFile, TraceFileError, read_trace_file
from agentrl.tracking.trace_record import EpisodeTrace, TracedCall, TracedRole, TracedTurn


def _trace(task: int) -> EpisodeTrace:
    call = TracedCall("move", {"direction": "north"}, answer="ok", scores={"reached": 1.0}, start_ns=5, end_ns=9)
    turn = TracedTurn([{"role": "user", "content": "go"}], {"role": "assistant", "content": "",
                                                            "reasoning": "north"}, "tool_calls", [call], "", 1, 4)
    role = TracedRole("agent", [turn], {"score": 1.0, "reward": 0.5, "weight": 1.0}, failure="")
    return EpisodeTrace(f"train step 1 t{task}", {"task_id": f"t{task}", "split": "train", "index": task},
                        [role], {"step": "1", "split": "train", "task_id": f"t{task}"}, {"score": {"agent": 1.0}})


def test_written_traces_read_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "rank" / "trl_traces_1.jsonl"
    traces = TraceFile(path, 0.5)
    assert traces.trace_train_fraction == 0.5
    traces.log_traces([_trace(0)])
    traces.log_traces([_trace(1), _trace(2)])
    assert read_trace_file(path) == [_trace(0), _trace(1), _trace(2)]
    assert read_trace_file(tmp_path / "none.jsonl") == []


def test_a_torn_last_line_is_skipped_and_a_bad_line_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    TraceFile(path, 0.0).log_traces([_trace(0), _trace(1)])
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:40])  # a writer killed mid-line
    assert read_trace_file(path) == [_trace(0), _trace(1)]
    path.write_text('{"name": "x"}\n' + whole)
    with pytest.raises(TraceFileError, match=r"t\.jsonl line 1: not an episode trace"):
        read_trace_file(path)
