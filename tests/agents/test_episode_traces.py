"""Episode traces: plays through the trainer's runner (real env server, scripted chat endpoint) logged to a real
MLflow store by the real tracker, and read back through MLflow's tracing API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from agentrl.agents.co_evolution import CoEvolutionAgent
from agentrl.agents.tool_calling import ToolCallingAgent
from agentrl.play.episode_traces import TraceAs, traced
from agentrl.play.rollout import RolloutRunner, make_row
from agentrl.rewards import Asymmetric, EnvScore
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.testing.mlflow_store import seed_store
from agentrl.tracking.mlflow_tracker import MLflowTracker


def _tracker(tmp_path: Path, fraction: float = 1.0) -> MLflowTracker:
    tracker = MLflowTracker(tracking_uri=seed_store(tmp_path / "mlflow.db"), experiment="traces",
                            trace_train_fraction=fraction)
    tracker.start(OmegaConf.create({"dry_run": False, "task_name": "traces"}), choices={}, run_dir=tmp_path / "run")
    return tracker


def _traces(tracker: MLflowTracker) -> list:
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    return list(client.search_traces(locations=[tracker.experiment_id], run_id=tracker.run_id, max_results=100))


def _spans(trace, span_type: str) -> list:
    return [s for s in trace.data.spans if s.span_type == span_type]


async def test_a_tool_calling_play_is_one_trace_with_its_calls_answers_and_invalid_call(
        tmp_path, gridsim_bundle, gridsim_url):
    greedy = gridsim_bundle.row("eval", 5)["greedy_schedule"]
    chat = ScriptedChat([
        Reply(tool_calls=[tool_call("submit_schedule", '{"schedule": [1, 0,')], reasoning_content="try first"),
        Reply(tool_calls=[tool_call("submit_schedule", {"schedule": greedy})]),
    ])
    tracker = _tracker(tmp_path)
    with chat.serve() as chat_url:
        # Played as an external endpoint: the scripted server records no tokens for the runner to read back.
        runner = RolloutRunner(ToolCallingAgent(max_turns=4), chat_url, reward=EnvScore(),
                               external={"agent": chat_url})
        runner.traces = tracker
        row = make_row(gridsim_bundle, "eval", 5, gridsim_url, {})
        [[rollout]] = await runner.play_rows([row], 1, request_kwargs={}, seed_parts=(0,),
                                             trace_as=TraceAs("eval", 3))
    tracker.finish()
    assert rollout.invalid_calls == 1 and rollout.tool_calls == 1 and 0 < rollout.score < 1
    [trace] = _traces(tracker)
    assert trace.info.tags["step"] == "3" and trace.info.tags["split"] == "eval"
    assert trace.info.tags["task_id"] == row["metadata"]["task_id"] and trace.info.tags["failed"] == "false"
    [role] = [s for s in trace.data.spans if s.name == "agent"]
    assert role.outputs["score"] == pytest.approx(rollout.score) and role.outputs["reward"] == rollout.reward
    assert role.outputs["weight"] == 1.0 and role.outputs["scores"] == rollout.scores
    turns = _spans(trace, "CHAT_MODEL")
    assert [t.name for t in turns] == ["turn 1", "turn 2"]
    # The first turn's request is the opening as sent; the second only what was added: the refused call's answer.
    assert [m["role"] for m in turns[0].inputs["messages"]] == ["system", "user"]
    assert [m["role"] for m in turns[1].inputs["messages"]] == ["tool"]
    assert turns[0].outputs["reasoning_content"] == "try first"
    invalid, submitted = _spans(trace, "TOOL")
    assert invalid.parent_id == turns[0].span_id and "not valid JSON" in invalid.outputs["invalid"]
    assert invalid.status.status_code == "ERROR"
    assert submitted.parent_id == turns[1].span_id and submitted.inputs == {"schedule": greedy}
    # The env's answer as the env server gave it: the grade it reports is the rollout's score.
    assert submitted.outputs["answer"] and submitted.outputs["scores"] == rollout.scores


def _role_of(body) -> str:
    system = body["messages"][0]["content"]
    for marker, role in (("Pick the best", "selector"), ("improved solution", "rewriter"), ("Solve the", "solver")):
        if marker in system:
            return role
    raise AssertionError(f"no role in {system!r}")


async def test_a_co_evolution_play_is_one_trace_with_a_span_per_role(tmp_path, arith_bundle, arith_url):
    label = arith_bundle.row("train", 0)["label"]

    def script(body, session_id):
        role = _role_of(body)
        if role == "selector":
            return Reply(content="Judgment: 0")
        return Reply(content=f"\\boxed{{{label}}}")

    tracker = _tracker(tmp_path)
    with ScriptedChat(script).serve() as chat_url:
        runner = RolloutRunner(CoEvolutionAgent(num_parallel=2, max_turns=2), chat_url, reward=Asymmetric(),
                               external={r: chat_url for r in ("solver", "rewriter", "selector")})
        runner.traces = tracker
        row = make_row(arith_bundle, "train", 0, arith_url, {})
        [played] = await runner.play_rows([row], 1, request_kwargs={}, seed_parts=(0,),
                                          trace_as=TraceAs("train", 1))
    tracker.finish()
    [trace] = _traces(tracker)
    roles = [s for s in trace.data.spans if s.parent_id == trace.data.spans[0].span_id]
    assert [s.name for s in roles] == ["solver", "solver", "rewriter", "rewriter", "selector"]
    assert [r.role for r in played] == [s.name for s in roles]
    assert trace.info.tags["roles"] == "solver,solver,rewriter,rewriter,selector"
    selector = roles[-1]
    assert selector.outputs["weight"] == pytest.approx(1.2) and selector.outputs["details"]["selected"] == 0
    [judgment] = [s for s in trace.data.spans if s.parent_id == selector.span_id]
    assert judgment.outputs["content"] == "Judgment: 0"
    assert "Pick the best" in json.dumps(judgment.inputs["messages"])


def test_training_plays_are_sampled_by_the_fraction_and_every_eval_play_is_traced():
    keys = [("train", i) for i in range(2000)]
    share = sum(traced(TraceAs("train", 5), 0.1, k, 0) for k in keys) / len(keys)
    assert 0.07 < share < 0.13
    assert not any(traced(TraceAs("train", 5), 0.0, k, 0) for k in keys)
    assert all(traced(TraceAs("eval", 5), 0.0, k, 0) for k in keys)
    assert [traced(TraceAs("train", 5), 0.1, k, 0) for k in keys] == \
        [traced(TraceAs("train", 5), 0.1, k, 0) for k in keys]  # the same plays in a rerun


def test_a_fraction_outside_0_1_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="logger.trace_train_fraction"):
        MLflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'x.db'}", trace_train_fraction=1.5)
