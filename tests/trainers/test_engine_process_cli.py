"""`inference.process=true` (and `env.server.process=true`) through the real CLI: the engine and the env server
run in child processes (the engine's threads in the plan), two GRPO steps with partial rollouts log finite metrics,
and no process of the run is left once it exits."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl

TINY = ["+recipe=gridsim_grpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
        "trainer.eval_limit=2", "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.warm_start.steps=2",
        "trainer.warm_start.batch_samples=2", "agent.max_response_tokens=16", "trainer.max_extra_rows=0",
        "trainer.drop_no_signal=false", "trainer.model_failures=penalize", "model.hidden_size=32",
        "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64",
        "model.vocab_size=1024"]
METRICS = ["train/loss", "train/reward", "train/grad_norm", "time/step_s", "time/weight_push_s",
           "async/engine_idle", "async/resumed_partial"]


def processes_of(home: Path) -> list[int]:
    """Pids of live processes started with AGENTRL_HOME=home (the run and any child it left behind)."""
    mark = f"AGENTRL_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if mark in env and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_two_steps_with_the_engine_in_its_own_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = [*TINY, "trainer.steps=2", "inference.process=true", "inference.process_threads=1",
            "trainer.partial_rollouts=true", "env.server.process=true"]
    run = run_agentrl(args, home)
    out = run.stdout + run.process.stderr
    assert re.search(r"engine process 1 \(inference\.process_threads", run.stdout), run.stdout[-3000:]
    assert re.search(r"engine process \d+ serves", out), out[-3000:]  # the engine ran in a child
    assert re.search(r"env server process \d+ serves gridsim", out), out[-3000:]  # and the env server in another
    client = run.client()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    rid = next(r.info.run_id for r in runs if r.data.metrics.get("train/loss") is not None)
    for key in METRICS:
        values = {m.step: m.value for m in client.get_metric_history(rid, key)}
        assert sorted(values) == [1, 2], f"{key} not logged at each step: {values}"
        assert all(math.isfinite(v) for v in values.values()), (key, values)
    assert all(0 <= v.value <= 1 for v in client.get_metric_history(rid, "async/engine_idle"))
    assert processes_of(home) == [], "a process of the run outlived it"


@pytest.mark.parametrize(("extra", "says"), [
    (["inference=sglang"], "trainer.partial_rollouts=true needs inference=embedded or inference=vllm"),
    (["inference=vllm", "model.lora.enabled=true"], "cannot push an adapter into running replies"),
])
def test_partial_rollouts_where_no_push_reaches_running_replies_are_refused_at_plan_time(
        tmp_path: Path, extra: list[str], says: str) -> None:
    run = run_agentrl(["+recipe=gridsim_grpo", *extra, "trainer.partial_rollouts=true", "dry_run=true"],
                      tmp_path / "home", check=False, seed_model=False)
    assert run.process.returncode != 0
    assert says in run.process.stderr + run.stdout
