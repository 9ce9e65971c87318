"""`trainer.max_staleness=2` through the real CLI: every `async/*` metric logged each step, and a run killed
mid-way resumes at the row cursor of the last trained step (not past the steps played ahead)."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.testing.cli import cli_env, run_agentrl

REPO = Path(__file__).resolve().parents[2]
# arith from the untrained tiny model (no warm start), every group kept (as test_trainer_protocol's runs): each
# step draws exactly prompts_per_step rows, so the cursor after step n is 2n, and each step trains and pushes.
TINY = ["env=arith", "agent=tool_calling", "reward=env_score", "agent.max_turns=2", "agent.max_response_tokens=8",
        "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=2", "trainer.eval_every=0",
        "trainer.checkpoint_every=1", "trainer.warm_start.enabled=false", "trainer.max_extra_rows=0",
        "trainer.drop_no_signal=false", "trainer.model_failures=penalize", "trainer.lr=1e-2",
        "trainer.max_staleness=2", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024"]
ASYNC = ["async/staleness_mean", "async/staleness_max", "async/dropped_stale", "async/held_s", "async/held_stale",
         "async/learner_idle", "async/producer_idle", "async/engine_idle", "async/resumed_partial",
         "train/logprob_gap_mean", "train/logprob_gap_max", "rollout/tail_share"]


def _history(home: Path) -> tuple:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, "one run (a resumed run continues the same MLflow run)"
    rid = runs[0].info.run_id

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(rid, key)}

    return runs[0], history


@pytest.mark.slow
def test_two_steps_at_k2_log_every_async_metric_each_step(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = [*TINY, "trainer.steps=2", "trainer.checkpoint_every=0"]
    run_agentrl(args, home)
    _, history = _history(home)
    for key in ASYNC:
        values = history(key)
        assert sorted(values) == [1, 2], f"{key} not logged at each step: {values}"
        assert all(math.isfinite(v) for v in values.values()), (key, values)
    # Step 2 was played ahead, beside step 1's update: its first tokens came from the start weights or, when the
    # loaded box let step 1 push before step 2's first request, from step 1's (the exact ages: test_staleness.py).
    assert history("train/updates") == {1: 1.0, 2: 1.0}
    assert history("async/staleness_max")[1] == 0 and history("async/staleness_max")[2] in (0.0, 1.0)
    assert all(0 <= v <= 1 for k in ("async/learner_idle", "async/producer_idle", "async/engine_idle")
               for v in history(k).values())
    assert history("async/dropped_stale") == {1: 0.0, 2: 0.0}  # stale_policy=wait drops nothing
    # Four concurrent plays never end at the same instant: each step's play had a tail, and it was part of the play.
    assert all(0 < v < 1 for v in history("rollout/tail_share").values()), history("rollout/tail_share")


@pytest.mark.slow
def test_killed_at_k2_resumes_at_the_trained_steps_cursor(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # Far more steps than the kill needs: on a quiet box these tiny steps run at ~7 a second, so a short run could
    # end (and prune step 2's checkpoint) between two looks at the folder.
    steps = 400
    args = [*TINY, f"trainer.steps={steps}"]
    proc = subprocess.Popen([sys.executable, "-m", "agentrl", *args], cwd=REPO, env=cli_env(home, args),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpts = home / "outputs" / "checkpoints"

    def saved_steps() -> list[int]:
        return [int(p.parent.name.split("-")[1]) for p in ckpts.glob("*/*/step-*/state.pt")]

    deadline = time.monotonic() + 1500
    while not any(step >= 2 for step in saved_steps()):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no step-2 checkpoint in time"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = max(saved_steps())
    assert saved < steps, "the run finished before it could be killed"
    state = torch.load(next(ckpts.glob(f"*/*/step-{saved:06d}/state.pt")), weights_only=False)
    # Steps saved+1 and saved+2 were drawn and playing when step `saved` was saved: the cursor excludes them.
    assert state["row_cursor"] == 2 * saved
    last = saved + 1
    killed_logged = set(_history(home)[1]("async/staleness_max"))
    again = [*TINY, f"trainer.steps={last}", "trainer.resume=true"]
    done = run_agentrl(again, home).process
    assert f"at step {last}" in done.stdout
    resumed = torch.load(next(ckpts.glob(f"*/*/step-{last:06d}/state.pt")), weights_only=False)
    assert resumed["row_cursor"] == 2 * last  # the replayed step drew the rows the killed run had drawn for it
    _, history = _history(home)
    assert sorted(history("train/reward")) == list(range(1, last + 1))
    # The resumed run's first step plays on its start weights. A step the killed run had already logged before it
    # died is not logged again (the run's history keeps the first), so its value is checked only when it is new.
    if last not in killed_logged:
        assert history("async/staleness_max")[last] == 0, history("async/staleness_max")
