"""`env=textarena`'s observation modes on the real TextArena TicTacToe: the compact board view and the full text."""

from __future__ import annotations

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.textarena.bundle import board_view, listed_moves


def play_first_moves(bundle, split: str, index: int, moves: int):
    """An episode after the agent's seat has played `moves` first listed moves; its current turn."""
    episode = bundle.episode(split, index)
    turn = episode.first_turn()
    for _ in range(moves):
        turn = episode.end_turn(listed_moves(episode.raw)[0])
    return episode, turn


def test_board_view_shows_the_mark_the_current_board_and_the_moves():
    bundle = load_bundle("textarena", game="TicTacToe-v0", observation="board", train_size=4, eval_size=4)
    episode, turn = play_first_moves(bundle, "train", 0, 2)  # self-play: player 0 [0], player 1 [1], player 0's turn
    assert episode.seat == 0 and turn.system_prompt.startswith("You are Player 0")
    assert turn.prompt == "You: O\nO X 2\n3 4 5\n6 7 8\nMoves: [2] [3] [4] [5] [6] [7] [8]"
    # The full observation is TextArena's transcript: the rules and every board since the start.
    assert episode.raw.count("Current Board:") == 3 and "Your goal is to win" in episode.raw
    assert len(turn.prompt) < len(episode.raw) / 5


def test_the_player_1_view_names_its_own_mark():
    bundle = load_bundle("textarena", game="TicTacToe-v0", observation="board", train_size=4, eval_size=4)
    _, turn = play_first_moves(bundle, "train", 0, 1)
    assert turn.system_prompt.startswith("You are Player 1")
    assert turn.prompt.splitlines()[:2] == ["You: X", "O 1 2"]


def test_full_observation_is_the_transcript_cut_by_prompt_chars():
    full = load_bundle("textarena", game="TicTacToe-v0", train_size=4, eval_size=4)
    _, turn = play_first_moves(full, "train", 0, 2)
    assert "Your goal is to win" in turn.prompt and turn.prompt.count("Current Board:") == 3
    cut = load_bundle("textarena", game="TicTacToe-v0", prompt_chars=100, train_size=4, eval_size=4)
    _, turn = play_first_moves(cut, "train", 0, 2)
    assert turn.prompt.startswith("...") and len(turn.prompt) == 103


def test_demonstrations_play_listed_moves_in_the_board_view():
    bundle = load_bundle("textarena", game="TicTacToe-v0", observation="board", train_size=8, eval_size=4)
    for index in range(4):
        messages = bundle.demonstration("train", index, "random")
        assert messages[0]["role"] == "system"
        users = [m["content"] for m in messages if m["role"] == "user"]
        moves = [m["content"] for m in messages if m["role"] == "assistant"]
        assert users and len(users) == len(moves)
        for shown, move in zip(users, moves, strict=True):
            assert shown.startswith("You: ") and "Current Board" not in shown
            assert move in shown.rsplit("Moves: ", 1)[1].split()  # a legal move, listed in the view


def test_board_view_of_text_without_a_board_is_none_and_bad_settings_fail():
    assert board_view("[GAME] Nim: take 1 to 3 stones") is None
    with pytest.raises(ValueError, match="env.observation='grid'"):
        load_bundle("textarena", game="TicTacToe-v0", observation="grid", train_size=4, eval_size=4)
