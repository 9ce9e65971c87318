"""A short real GRPO run (tiny model, gridsim) with every training play traced: the run's MLflow traces, read back
through MLflow's API, hold each play's turns, its tool calls with the env's answers, and the filter tags."""

from __future__ import annotations

from pathlib import Path

from agentrl.testing.cli import run_agentrl

ARGS = ["+recipe=gridsim_grpo", "trainer.steps=1", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
        "trainer.eval_limit=2", "trainer.eval_every=1", "trainer.checkpoint_every=0", "trainer.max_extra_rows=0",
        "trainer.warm_start.steps=2", "trainer.warm_start.batch_samples=2", "agent.max_response_tokens=24",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
        "model.intermediate_size=64", "model.vocab_size=1024", "logger.trace_train_fraction=1"]


def test_a_short_run_traces_its_plays_with_their_tool_calls_and_env_answers(tmp_path: Path) -> None:
    client = run_agentrl(ARGS, tmp_path / "home").client()
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    traces = list(client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id,
                                       max_results=500))
    by_split: dict[str, list] = {}
    for trace in traces:
        by_split.setdefault(trace.info.tags["split"], []).append(trace)
    # Every training play (2 prompts x 2 samples at step 1) and every eval play (2 tasks at steps 0 and 1).
    assert len(by_split["train"]) == 4 and {t.info.tags["step"] for t in by_split["train"]} == {"1"}
    assert len(by_split["eval"]) == 4 and {t.info.tags["step"] for t in by_split["eval"]} == {"0", "1"}
    # The warm start this run made: its eval's plays (2 tasks) too, at its last SFT step.
    assert len(by_split["warm_start/eval"]) == 2 and {t.info.tags["step"] for t in by_split["warm_start/eval"]} == {"2"}
    answered = 0
    for trace in traces:
        tags = trace.info.tags
        assert tags["task_id"] and tags["policy_version"] and tags["roles"] == "agent"
        [role] = [s for s in trace.data.spans if s.span_type == "AGENT" and s.parent_id is not None]
        assert {"score", "reward", "weight", "scores"} <= set(role.outputs)
        turns = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
        assert turns and [m["role"] for m in turns[0].inputs["messages"]][:2] == ["system", "user"]
        for call in (s for s in trace.data.spans if s.span_type == "TOOL"):
            assert call.parent_id in {t.span_id for t in turns}
            # A call the env answered holds the answer (and the scores when it ended the episode); one refused
            # before the env says why; one the env never answered leaves its role flagged.
            assert call.outputs.get("answer") or "scores" in call.outputs or call.outputs.get("invalid") \
                or "failure" in role.outputs
            answered += bool(call.outputs.get("answer") or call.outputs.get("scores"))
    assert answered > 0
