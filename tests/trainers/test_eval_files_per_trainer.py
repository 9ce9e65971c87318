"""Training's own evals write the per-task results file `agentrl eval` writes, under every trainer: short real CLI
runs (tiny model, GridSim) of `trainer=trl` (one process and two), `trainer=sft`, and the warm start a TRL or GRPO
run makes. Each file is read back from the run folder and from MLflow; its mean task score is the logged
`eval/reward` of its step. The TRL runs also trace their plays: every eval play and (with
`logger.trace_train_fraction=1`) every training play, with the real tool calls and the env's answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.play.eval_results import read_results, task_score
from agentrl.testing.cli import CliRun, run_agentrl

TINY = ["agent.max_response_tokens=24", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024", "trainer.eval_limit=2"]
TRL = ["+recipe=gridsim_grpo", "trainer=trl", *TINY, "trainer.steps=1", "trainer.prompts_per_step=2",
       "trainer.samples_per_prompt=2", "trainer.eval_every=1", "trainer.checkpoint_every=0",
       "trainer.warm_start.steps=2", "trainer.warm_start.batch_samples=2", "trainer.warm_start.augment=0",
       "logger.trace_train_fraction=1"]
SFT = ["+recipe=gridsim_sft", *TINY, "trainer.steps=2", "trainer.batch_samples=2", "trainer.augment=0",
       "trainer.eval_every=1"]


def _metric_at(run: CliRun, key: str, step: int) -> float:
    """The last value of `key` logged at `step`."""
    history = [m for m in run.client().get_metric_history(run.mlflow_run().info.run_id, key) if m.step == step]
    assert history, f"{key} was not logged at step {step}"
    return max(history, key=lambda m: m.timestamp).value


def _check_eval_file(run: CliRun, name: str, metric: str, step: int) -> list[dict[str, Any]]:
    """The per-task file `evals/<name>.jsonl`: in the run folder and, identical, in MLflow with its table; one
    scored sample per task; its mean task score the logged `metric` at `step`."""
    local = run.run_dir() / "evals" / f"{name}.jsonl"
    records = read_results(local)
    assert len(records) == 2 and len({r["task_id"] for r in records}) == 2  # trainer.eval_limit=2 tasks
    assert all(r["task_id"] and r["step"] == step for r in records)
    assert all(len(r["samples"]) == 1 and "completion_tokens" in r["samples"][0] for r in records)
    client, run_id = run.client(), run.mlflow_run().info.run_id
    logged = {a.path for a in client.list_artifacts(run_id, "evals")}
    assert {f"evals/{name}.jsonl", f"evals/{name}_table.json"} <= logged, logged
    copy = Path(client.download_artifacts(run_id, f"evals/{name}.jsonl", str(run.home / "downloads")))
    assert read_results(copy) == records
    mean = sum(task_score(r) for r in records) / len(records)
    assert mean == pytest.approx(_metric_at(run, metric, step), abs=1e-9), name
    return records


def _check_traces(run: CliRun, splits: dict[str, set[str]]) -> None:
    """The run's traces, read back through MLflow: at each split's steps, each with its play's tool calls and
    the env's answers."""
    client, mlflow_run = run.client(), run.mlflow_run()
    traces = list(client.search_traces(locations=[mlflow_run.info.experiment_id], run_id=mlflow_run.info.run_id,
                                       max_results=500))
    seen: dict[str, set[str]] = {}
    assert traces
    for trace in traces:
        seen.setdefault(trace.info.tags["split"], set()).add(trace.info.tags["step"])
        assert trace.info.tags["task_id"] and trace.info.tags["roles"] == "agent"
        turns = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
        assert turns and [m["role"] for m in turns[0].inputs["messages"]][:2] == ["system", "user"]
        calls = [s for s in trace.data.spans if s.span_type == "TOOL"]
        for call in calls:
            assert call.parent_id in {t.span_id for t in turns}
        answered = any(call.outputs.get("answer") or call.outputs.get("scores") for call in calls)
        # The untrained tiny model's reply is usually cut at max_response_tokens without a call: such a play is
        # flagged truncated (on its role's span) and never reaches the env, so it holds no answer.
        (role,) = [s for s in trace.data.spans if s.attributes.get("role") == "agent"]
        assert answered or role.attributes.get("failure") == "truncated", (trace.info.tags, role.attributes)
    for split, steps in splits.items():
        assert seen.get(split) == steps, f"{split}: traced at {seen.get(split)}, expected {steps}"


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_trl_evals_write_per_task_files_and_trace_their_plays(processes: int, tmp_path: Path) -> None:
    run = run_agentrl([*TRL, f"trainer.num_processes={processes}"], tmp_path / "home")
    for name, metric, step in (("eval-step-0", "eval/reward", 0), ("eval-step-1", "eval/reward", 1),
                               ("eval_greedy-step-1", "eval_greedy/reward", 1),
                               ("warm_start-eval-step-2", "warm_start/eval/reward", 2)):
        _check_eval_file(run, name, metric, step)
    # Every training play (2 prompts x 2 samples, over the ranks) and every eval play, the warm start's too.
    _check_traces(run, {"train": {"1"}, "eval": {"0", "1"}, "eval_greedy": {"1"}, "warm_start/eval": {"2"}})
    client, mlflow_run = run.client(), run.mlflow_run()
    train = client.search_traces(locations=[mlflow_run.info.experiment_id], run_id=mlflow_run.info.run_id,
                                 filter_string="tags.split = 'train'", max_results=100)
    assert len(train) == 4


@pytest.mark.slow
def test_sft_evals_write_per_task_files(tmp_path: Path) -> None:
    run = run_agentrl(SFT, tmp_path / "home")
    for name, metric, step in (("eval-step-1", "eval/reward", 1), ("eval-step-2", "eval/reward", 2),
                               ("eval_greedy-step-2", "eval_greedy/reward", 2)):
        _check_eval_file(run, name, metric, step)
    _check_traces(run, {"eval": {"1", "2"}, "eval_greedy": {"2"}})
    # the mid-run eval's model is a folder of its own, gone at the end; the output folder holds only the final model
    sft = tmp_path / "home" / "outputs" / "checkpoints" / "sft"
    assert [p.name for p in sft.iterdir()] == [p.name for p in sft.glob("gridsim-optimal-s2-*")], list(sft.iterdir())
    assert len(list(sft.iterdir())) == 1


class _Tracker:
    """What `log_rank_files` logs, by kind."""

    def __init__(self) -> None:
        self.artifacts: list[str] = []
        self.traces: list[Any] = []

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.artifacts.append(Path(path).name)

    def log_table(self, rows: list[dict[str, Any]], name: str) -> None:
        pass

    def log_traces(self, traces: list[Any]) -> None:
        self.traces += traces


def test_a_torn_rank_file_costs_only_itself(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rank killed while writing (accelerate stops the others when one fails) leaves a torn eval file: the parent
    still logs the ranks' other files, and says which file it could not log, instead of raising over the run's own
    outcome (the workers' error, or a finished run's final model)."""
    from agentrl.tracking.trace_file import TraceFile
    from agentrl.trainers.trl.trainer import log_rank_files
    from tests.tracking.test_trace_file import _trace

    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "eval-step-1.jsonl").write_text('{"task_id": "t0", "samples": [{"score": 1.0}]}\n{"task_id": "t1", "sa')
    (evals / "eval-step-2.jsonl").write_text('{"task_id": "t0", "samples": [{"score": 0.5}]}\n')
    TraceFile(tmp_path / "trl_traces_7.jsonl", 1.0).log_traces([_trace(0), _trace(1)])
    tracker = _Tracker()
    log_rank_files(tmp_path, tracker, since=0.0)
    assert "eval-step-2.jsonl" in tracker.artifacts and tracker.traces == [_trace(0), _trace(1)]
    assert "eval-step-1.jsonl" in caplog.text
