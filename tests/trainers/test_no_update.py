"""A step that trains nothing says so: `train/updates`, a console warning and the end-of-run block's line.

Then the quick look (`+recipe=gridsim_quick`, the README's) really trains: every step makes an update.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl
from agentrl.trainers.common.no_update import NoUpdateWatch
from tests.trainers.test_grpo_cli import TINY, _cli, _runs


def _history(home: Path, key: str) -> dict[int, float]:
    client, runs = _runs(home)
    assert len(runs) == 1
    return {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, key)}


def test_the_watch_warns_on_a_streak_and_names_the_cause(caplog: pytest.LogCaptureFixture) -> None:
    watch = NoUpdateWatch(warn_after=2)
    trained = {"train/updates": 1.0, "train/tokens": 40.0}
    idle = {"train/updates": 0.0, "train/tokens": 0.0, "rollout/groups_dropped/failed": 4.0,
            "rollout/flagged/truncated": 0.5}
    with caplog.at_level(logging.WARNING, logger="agentrl.trainers.common.no_update"):
        watch.add(1, trained)
        watch.add(2, idle)
        assert not caplog.records  # one idle step is not yet a streak
        watch.add(3, idle)
        watch.add(4, {"eval/reward": 0.5})  # an eval-only record is no step
        watch.add(5, idle)  # a streak of 3: warned at 2, next at 4
    [warning] = caplog.records
    assert "steps 2-3 made no optimizer update" in warning.getMessage()
    assert "50% of rollouts were flagged truncated" in warning.getMessage()
    assert "trainer.model_failures=penalize" in warning.getMessage()
    assert watch.metrics() == {"train/no_update_steps": 3.0}
    [line] = watch.closing_lines()
    assert line.startswith("no update     3 of 4 steps trained nothing: every group was dropped (failed 12)")
    # Groups without signal point elsewhere; TRL is offered no penalize.
    flat = NoUpdateWatch(penalize=False)
    flat.add(1, {"train/updates": 0.0, "rollout/groups_dropped/no_signal": 4.0})
    assert "rewards were equal" in flat.reason() and "penalize" not in flat.reason()
    # A role policy's update counts (train/<policy>/updates).
    roles = NoUpdateWatch()
    roles.add(1, {"train/updates": 0.0, "train/solver/updates": 1.0})
    assert roles.metrics() == {"train/no_update_steps": 0.0} and roles.closing_lines() == []


@pytest.mark.slow
def test_a_run_whose_groups_are_all_dropped_says_it_trained_nothing(tmp_path: Path) -> None:
    """A 2-step warm start earns nothing on GridSim: every group's rewards are all 0 (no signal) and dropped."""
    home = tmp_path / "home"
    # Replies cut at 4 tokens make no call and are flagged truncated; model_failures=penalize keeps each such play
    # in its group at reward 0, so every group's rewards are equal (no signal) rather than the group dropped as failed.
    done = _cli(["+recipe=gridsim_grpo", *TINY, "agent.max_response_tokens=4", "trainer.model_failures=penalize",
                 "trainer.steps=3", "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.max_staleness=0"], home)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "made no optimizer update (train/updates=0)" in done.stderr + done.stdout
    closing = done.stdout[done.stdout.rindex("== agentrl run FINISHED"):]
    assert "no update     3 of 3 steps trained nothing: every group was dropped (no_signal 6)" in closing
    assert "rewards were equal" in closing and "trainer.warm_start.steps" in closing
    assert _history(home, "train/updates") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert _history(home, "train/no_update_steps") == {3: 3.0}


@pytest.mark.slow
def test_the_quick_look_trains_on_every_step(tmp_path: Path) -> None:
    """The README's quick look with its warm start and GRPO settings, 5 of its steps and a short eval (the cost is the
    warm start): every step updates. From the 100-step warm start the README used, with model_failures=drop,
    every step dropped every group (benchmarks/RESULTS.md, "The quick look")."""
    home = tmp_path / "home"
    # Torch's default threads, as the README's command runs it: the warm start's SFT uses both cores (1.6x its
    # one-thread speed on 2 idle cores, benchmarks/RESULTS.md "Threads"); the recipe's GRPO sets its own 1.
    done = run_agentrl(["+recipe=gridsim_quick", "trainer.steps=5", "trainer.eval_limit=4"], home,
                       env={"OMP_NUM_THREADS": None}).process
    tokens, updates = _history(home, "train/tokens"), _history(home, "train/updates")
    steps = _history(home, "train/reward")
    assert len(steps) == 5 and set(tokens) == set(updates) == set(steps)
    assert all(v > 0 for v in tokens.values()), tokens
    assert all(v == 1.0 for v in updates.values()), updates
    assert "no update " not in done.stdout
