"""GridSim's `generated` split (`env.generated_days`): fresh train-like days drawn on demand, served and graded
like the stored ones, apart from the SFT warm start's generated stream, and absent (with the old data key) at 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.gridsim.tasks import GENERATED_SPLIT_STREAM, cents_of, generated_task
from agentrl.envs.server import build_app, serve_in_background
from agentrl.testing.cli import run_agentrl


def test_the_split_is_the_generators_stream_and_apart_from_the_warm_starts():
    bundle = load_bundle("gridsim", generated_days=50, train_split="generated")
    assert bundle.splits() == {"train": 2000, "eval": 200, "generated": 50}
    assert bundle.row("generated", 7) == generated_task(7, GENERATED_SPLIT_STREAM)
    assert bundle.rows("generated")[7] == bundle.row("generated", 7)
    ids = {bundle.task_info("generated", i).task_id for i in range(50)}
    assert len(ids) == 50 and all(i.startswith("gridsim-generated-") for i in ids)
    # The SFT warm start draws its generated days with the run's seed: none of those is one of these.
    prices = {tuple(cents_of(bundle.row("generated", i))) for i in range(50)}
    assert len(prices) == 50
    assert not prices & {tuple(cents_of(generated_task(i, seed))) for seed in (0, 1, 2) for i in range(50)}
    with pytest.raises(IndexError, match="split 'generated' has no task 50"):
        bundle.row("generated", 50)


def test_without_the_split_the_bundle_and_its_data_key_are_unchanged():
    plain = load_bundle("gridsim", prompt_style="compact")
    assert "generated" not in plain.splits() and plain.data_options() == {"prompt_style": "compact"}
    assert load_bundle("gridsim", generated_days=10).data_options() == {"prompt_style": "full", "generated_days": 10}
    with pytest.raises(ValueError, match="no split 'generated'"):
        load_bundle("gridsim", train_split="generated")


@pytest.mark.parametrize("bad", [-1, 2.5, True, "100", None, 10**12])
def test_a_bad_count_is_refused_naming_the_setting(bad):
    with pytest.raises(ValueError, match=r"env.generated_days\) must be a whole number from 0 to 10,000,000"):
        load_bundle("gridsim", generated_days=bad)


def test_the_server_plays_and_grades_a_generated_day():
    bundle = load_bundle("gridsim", generated_days=1000)
    optimal = bundle.row("generated", 999)["optimal_schedule"]
    with serve_in_background(build_app(bundle, max_concurrent_envs=2)) as url:
        with MCPToolClient(base_url=url, message_timeout_s=60).sync() as env:
            r = env.reset(split="generated", index=999)
            assert r.observation.metadata["task"]["id"] == bundle.task_info("generated", 999).task_id
            r = env.step(CallToolAction(tool_name="submit_schedule", arguments={"schedule": optimal}))
            assert r.done is True and r.reward == 1.0


@pytest.mark.slow
def test_grpo_trains_on_generated_days_through_the_cli(tmp_path: Path):
    home = tmp_path / "home"
    args = ["+recipe=gridsim_beat_teacher", "env.generated_days=100000", "env.train_split=generated",
            "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
            "model.intermediate_size=64", "model.vocab_size=1024", "trainer.warm_start.enabled=false",
            "trainer.steps=2", "trainer.eval_every=0", "trainer.eval_limit=2", "trainer.prompts_per_step=2",
            "trainer.samples_per_prompt=2", "agent.max_response_tokens=16", "trainer.threads=1"]
    # The run builds its model and its store.
    client = run_agentrl(args, home, seed_model=False, seed_store=False, timeout=900).client()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    run = next(r for r in runs if "train/reward" in r.data.metrics)
    assert run.data.params["env/train_split"] == "generated" and run.data.params["env/generated_days"] == "100000"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/reward")]
    assert sorted(steps) == [1, 2]
