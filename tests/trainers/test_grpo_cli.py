"""The GRPO trainer through the real CLI: metrics in MLflow, kill + resume, and an Optuna sweep."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.testing.cli import cli_env, run_agentrl
from agentrl.trainers.common.step_fill import RowStream

REPO = Path(__file__).resolve().parents[2]
TINY = ["trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=3",
        "trainer.eval_every=1", "trainer.checkpoint_every=1", "trainer.warm_start.steps=2",
        "trainer.warm_start.batch_samples=2", "agent.max_response_tokens=24", "trainer.max_extra_rows=0",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
        "model.intermediate_size=64", "model.vocab_size=1024"]
REQUIRED = ["train/reward", "eval/reward", "eval/reward_1h", "eval/zero_share", "rollout/flagged",
            "rollout/invalid_tool_calls", "rollout/groups_dropped", "time/generate_s", "time/train_s",
            "time/step_s", "time/weight_push_s", "perf/generate_tokens_per_s", "train/loss", "train/kl",
            "train/clip_fraction", "train/grad_norm", "eval_greedy/reward"]


def _cli(args: list[str], home: Path, timeout: float = 1500) -> subprocess.CompletedProcess:
    return run_agentrl(args, home, timeout=timeout, check=False).process


def _runs(home: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exps = client.search_experiments()
    return client, client.search_runs([e.experiment_id for e in exps])


def test_row_stream_resumes_identically() -> None:
    a = RowStream(10, seed=3)
    first = [a.next() for _ in range(25)]
    b = RowStream(10, seed=3, cursor=13)
    assert [b.next() for _ in range(12)] == first[13:]
    assert sorted(first[:10]) == list(range(10)) and first[:10] != first[10:20]  # each epoch a new permutation


@pytest.mark.slow
def test_two_steps_then_kill_and_resume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["+recipe=gridsim_grpo", *TINY]
    # A run of 5 steps killed once its step-1 checkpoint exists (a fast step may have saved step 2 too) ...
    proc = subprocess.Popen([sys.executable, "-m", "agentrl", *args, "trainer.steps=5"], cwd=REPO, env=cli_env(home, args),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 1200
    ckpts = home / "outputs" / "checkpoints" / "gridsim_grpo"
    while not list(ckpts.glob("*/step-000001/state.pt")):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no step-1 checkpoint in time"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = max(int(p.parent.name.split("-")[1]) for p in ckpts.glob("*/step-*/state.pt"))
    assert saved < 5, "the run finished before it could be killed"
    # ... resumes at the step after the newest checkpoint in the same MLflow run and finishes one step later.
    last = saved + 1
    done = _cli([*args, f"trainer.steps={last}", "trainer.resume=true"], home)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "resuming from" in done.stdout and f"at step {last}" in done.stdout
    client, runs = _runs(home)
    assert len(runs) == 1, "resume must continue the same MLflow run"
    run = runs[0]
    for key in REQUIRED:
        assert key in run.data.metrics, f"{key} missing; logged: {sorted(run.data.metrics)}"
        assert math.isfinite(run.data.metrics[key])
    evals = client.get_metric_history(run.info.run_id, "eval/reward")
    assert sorted(m.step for m in evals) == list(range(last + 1))  # before step 1, then after each; none twice
    train = client.get_metric_history(run.info.run_id, "train/reward")
    assert sorted(m.step for m in train) == list(range(1, last + 1))
    arts = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
    assert "plots/reward_curves.png" in arts


@pytest.mark.slow
@pytest.mark.slow
def test_overlapped_rollouts_train_one_version_stale_and_checkpoint_the_right_cursor(tmp_path: Path) -> None:
    """max_staleness=1 plays step n+1 while step n trains: from step 2 on, the trained turns were sampled one
    weight version back; a checkpoint's row cursor excludes the rows already drawn for the next step."""
    import torch

    home = tmp_path / "home"
    done = _cli(["+recipe=gridsim_grpo", *TINY, "trainer.steps=3", "trainer.max_staleness=1",
                 "trainer.eval_every=0"], home)
    assert done.returncode == 0, done.stderr[-4000:]
    client, runs = _runs(home)
    rid = runs[0].info.run_id

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(rid, key)}

    # Step 1 is played then trained; steps 2 and 3 were already playing while the step before trained, so the
    # step waited less than their play took (played then trained, the wait spans the whole play).
    generate, wait = history("time/generate_s"), history("time/generate_wait_s")
    assert wait[1] >= generate[1] and all(wait[s] < generate[s] for s in (2, 3)), (wait, generate)
    # A turn is at most one version stale (the tiny model here may train before the next play's first turn).
    assert all(0 <= v <= 1 for v in history("rollout/weight_lag").values())
    for key in REQUIRED + ["time/generate_wait_s"]:
        assert math.isfinite(runs[0].data.metrics[key]), key
    drawn = history("rollout/rows_drawn")
    state = torch.load(next(home.glob("outputs/checkpoints/gridsim_grpo/*/step-000002/state.pt")), weights_only=False)
    assert state["row_cursor"] == drawn[1] + drawn[2]


def test_optuna_sweep_children_under_parent(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _cli(["-m", "+recipe=gridsim_grpo", "hparams_search=gridsim_optuna", "hydra.sweeper.n_trials=2",
                 "trainer.steps=1", "trainer.eval_every=0", "trainer.checkpoint_every=0", *TINY[:2],
                 *TINY[2:3], *TINY[5:]], home, timeout=1700)
    assert done.returncode == 0, done.stderr[-4000:]
    _, runs = _runs(home)
    parents = [r for r in runs if r.data.tags.get("agentrl.sweep") == "true"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == 2
    assert all(math.isfinite(c.data.metrics["eval/reward"]) for c in children)


def _group(index: int, rewards: list[float], failure: str | None = None) -> list:
    from agentrl.agents.record import Failure, Rollout
    from agentrl.inference.sessions.samples import Sample

    return [Rollout(reward=r, failure=Failure(failure) if failure else None, group=("train", index, "agent"),
                    sample=Sample([1, 2], [0, 1], [0.0, -1.0], r), row={"metadata": {"index": index}})
            for r in rewards]


def test_filtered_groups_are_replaced_by_new_rows() -> None:
    from agentrl.group_filter import group_drop_reason
    from agentrl.trainers.common.step_fill import fill_step

    # Rows 0 and 2 are all-equal groups (no signal), row 3 holds a flagged rollout: all dropped and replaced.
    table = {0: [0.0, 0.0], 1: [0.0, 1.0], 2: [0.5, 0.5], 3: [1.0, 0.2], 4: [0.3, 0.9], 5: [0.1, 0.4]}
    stream = RowStream(6, seed=0)
    ref = RowStream(6, seed=0)
    order = [ref.next() for _ in range(6)]
    calls: list[list[int]] = []

    def play(indices: list[int], attempt: int) -> list[list]:
        calls.append(indices)
        return [_group(i, table[i], "env_error" if i == 3 else None) for i in indices]

    kept, seen, dropped, drawn = fill_step(stream.next, play, want=3, budget=6, drop=group_drop_reason)
    good = [i for i in order if i in (1, 4, 5)]
    assert [g[0].group[1] for g in kept] == good
    assert drawn == stream.cursor == len(seen) // 2 and sum(dropped.values()) == drawn - 3
    played_rows = [i for c in calls for i in c]
    assert dropped["failed"] == played_rows.count(3)
    assert dropped["no_signal"] == played_rows.count(0) + played_rows.count(2)
    assert calls[0] == order[:3] and sum(map(len, calls)) == drawn  # each round draws only what is missing
    # With too small a budget the step stays short instead of looping forever.
    kept2, _, _, drawn2 = fill_step(RowStream(6, seed=0).next, play, want=3, budget=3, drop=group_drop_reason)
    assert drawn2 == 3 and len(kept2) == sum(i in (1, 4, 5) for i in order[:3])


def test_model_failures_penalized_stay_in_their_group() -> None:
    from agentrl.config.trainer import GRPOTrainerConfig
    from agentrl.group_filter import FAILED, NO_SIGNAL, group_drop_reason

    def group(*members: tuple[float, str | None]) -> list:
        return [r for reward, failure in members for r in _group(0, [reward], failure)]

    truncated = group((1.0, None), (0.0, "truncated"), (0.5, None))
    assert group_drop_reason(truncated) == FAILED  # the default: drop
    assert group_drop_reason(truncated, penalize_model_failures=True) is None  # kept: the 0 is a bad answer
    for failure in ("over_budget", "max_turns"):
        assert group_drop_reason(group((1.0, None), (0.0, failure)), penalize_model_failures=True) is None
    # The env's, the sandbox's or the engine's failures say nothing about the policy: dropped either way.
    for failure in ("env_error", "env_gone", "model_error", "tool_timeout", "no_model_turn"):
        assert group_drop_reason(group((1.0, None), (0.0, failure)), penalize_model_failures=True) == FAILED
    # Every member truncated: all rewards 0, nothing to learn from.
    assert group_drop_reason(group((0.0, "truncated"), (0.0, "truncated")), penalize_model_failures=True) == NO_SIGNAL
    with pytest.raises(ValueError, match="trainer.model_failures must be drop or penalize"):
        GRPOTrainerConfig(model_failures="ignore")


@pytest.mark.slow
def test_arith_co_evolution_recipe_trains_and_logs_multi_agent_metrics(tmp_path: Path) -> None:
    home = tmp_path / "home"
    small = [a for a in TINY if not a.startswith("trainer.eval_every")]  # a 2-step warm start, the recipe's own
    done = _cli(["+recipe=arith_co_evolution", *small, "trainer.prompts_per_step=1", "agent.num_parallel=2",
                 "trainer.steps=1", "trainer.eval_limit=2", "agent.max_response_tokens=12"], home)
    assert done.returncode == 0, done.stderr[-4000:]
    client, runs = _runs(home)
    assert len(runs) == 1
    metrics = runs[0].data.metrics
    # A 2-step warm start rambles: every solver reply is cut at max_response_tokens, which co-evolution flags
    # (truncated) instead of grading it, so each play ends after its solvers (the scripted tests play every role).
    assert metrics["rollout/flagged/truncated"] > 0 and metrics["multi_agent/early_termination_rate"] > 0
    for key in ("multi_agent/avg_turns", "multi_agent/early_termination_rate",
                "multi_agent/conversation_token_count", "loss_mask/role_split", "reward/avg",
                "reward/solver", "eval/reward", "train/reward"):
        assert key in metrics and math.isfinite(metrics[key]), f"{key}: logged {sorted(metrics)}"
    assert runs[0].data.tags["choice.agent"] == "co_evolution" and runs[0].data.tags["choice.reward"] == "asymmetric"
    assert "health: " in done.stdout and "health/out_of_range" in metrics  # the recipe's ranges, judged at the end
