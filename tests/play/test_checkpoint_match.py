"""Matches against a fixed checkpoint (`play/checkpoint_match.py`) on the real TicTacToe env server: the model
under test (the tiny model on the real engine) takes seat i % 2 of match i, the opponent the other seat, through
its own route; here the opponent is an OpenAI-compatible endpoint that plays the heuristic, so who played which
seat shows in what it was asked and in the outcomes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agentrl.envs.bundles.textarena.tictactoe import heuristic_move
from agentrl.plan import build_plan
from agentrl.play.checkpoint_match import checkpoint_matches, match_metrics
from agentrl.testing.config import compose_config
from agentrl.testing.scripted_chat import ScriptedChat
from agentrl.testing.tiny_models import shared_tiny_model

SMALL = dict(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
             max_position_embeddings=512)


def plan_of(tmp_path: Path, tiny: str, *overrides: str):
    small = [f"model.{k}={v}" for k, v in SMALL.items()]
    cfg = compose_config("+recipe=textarena_self_play_learns", f"model.path={tiny}", *small, "env.eval_size=6",
                         "agent.max_context_tokens=500", "trainer.warm_start.enabled=false",
                         f"paths.output_root={tmp_path}", *overrides)
    return build_plan(cfg, choices={}, run_dir=tmp_path / "run")


def test_the_tested_model_alternates_seats_against_the_frozen_opponent(tmp_path: Path) -> None:
    tiny = shared_tiny_model(seed=0, **SMALL)
    plan = plan_of(tmp_path, tiny, "env.eval_opponent=null")
    chat = ScriptedChat(lambda body, _sid: heuristic_move(body["messages"][-1]["content"]))
    with chat.serve() as url:
        metrics, scores = checkpoint_matches(plan, tiny, url, sampling=plan.sampling, seed_parts=(0,))
    assert sorted(scores) == list(range(6))
    for key in ("checkpoint/reward", "checkpoint/wins_minus_losses", "checkpoint/reward_seat0",
                "checkpoint/reward_seat1"):
        assert math.isfinite(metrics[key]), key
    seats = [m["content"].split(" in the game")[0] for body in chat.requests for m in body["messages"][:1]]
    # Matches 1, 3, 5 seat the opponent first (player 0): it moves at least once in each; as player 1 (matches
    # 0, 2, 4) it moves unless the tested model's illegal moves ended the match first. The tiny untrained model
    # on the other seat never beats the heuristic.
    assert seats.count("You are Player 0") >= 3 and set(seats) <= {"You are Player 0", "You are Player 1"}
    assert all(scores[i] <= 0.5 for i in scores), scores


def test_a_scripted_eval_opponent_is_refused_naming_the_setting(tmp_path: Path) -> None:
    tiny = shared_tiny_model(seed=0, **SMALL)
    plan = plan_of(tmp_path, tiny)  # the recipe's eval split seats the scripted random player
    with pytest.raises(ValueError, match="env.eval_opponent=random: matches against a checkpoint need a self-play"):
        checkpoint_matches(plan, tiny, tiny, sampling=plan.sampling)


def test_match_metrics_count_wins_minus_losses_per_match() -> None:
    metrics = match_metrics({0: 1.0, 1: 0.5, 2: 1.0, 3: 0.0}, seats=2)
    assert metrics["checkpoint/reward"] == 0.625
    assert metrics["checkpoint/wins_minus_losses"] == pytest.approx(0.25)  # (2 wins - 1 loss) / 4
    assert metrics["checkpoint/reward_seat0"] == 1.0 and metrics["checkpoint/reward_seat1"] == 0.25
    assert (metrics["checkpoint/win_share"], metrics["checkpoint/draw_share"], metrics["checkpoint/loss_share"]) \
        == (0.5, 0.25, 0.25)
