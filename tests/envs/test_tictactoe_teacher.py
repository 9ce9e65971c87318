"""The `heuristic` TicTacToe player (teacher and scripted opponent): on hand-made positions it wins when it can,
else blocks, else takes the centre, then a corner; on real TextArena matches it only ever plays listed moves."""

from __future__ import annotations

import random

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.textarena.bundle import listed_moves
from agentrl.envs.bundles.textarena.tictactoe import heuristic_move, parse_position


def view(mark: str, rows: str) -> str:
    """A `board_view` position from 9 cells written row by row ('.' empty), its moves the empty cells."""
    cells = [c if c != "." else str(i) for i, c in enumerate(rows.replace(" ", ""))]
    moves = " ".join(f"[{i}]" for i, c in enumerate(cells) if c.isdigit())
    return f"You: {mark}\n" + "\n".join(" ".join(cells[r * 3:r * 3 + 3]) for r in range(3)) + f"\nMoves: {moves}"


@pytest.mark.parametrize(("mark", "rows", "move"), [
    ("O", "OO. XX. ...", "[2]"),  # its own row: win, though X threatens [5]
    ("X", "XX. OO. ...", "[2]"),  # likewise for X: a win beats a block
    ("X", "O.. XX. O..", "[5]"),  # win along the middle row
    ("O", "XX. .O. ...", "[2]"),  # no win: block X's top row
    ("O", "... ... ...", "[4]"),  # nothing to win or block: the centre
    ("X", "... .O. ...", "[0]"),  # centre taken: a corner
    ("X", "O.. .X. ...", "[2]"),  # centre and corner 0 taken: the next corner
    ("X", "XOX .O. OXO", "[3]"),  # centre and corners taken, nothing to win or block: the first listed move
])
def test_wins_then_blocks_then_centre_then_corner(mark: str, rows: str, move: str) -> None:
    assert heuristic_move(view(mark, rows)) == move


def test_only_listed_moves_are_played_and_a_full_board_is_refused() -> None:
    # The winning cell [2] is not listed (the game refuses it): the heuristic blocks X at [5] instead.
    position = view("O", "OO. XX. ...").replace("[2] ", "")
    assert heuristic_move(position) == "[5]"
    with pytest.raises(ValueError, match="no moves listed"):
        heuristic_move(view("X", "OXO OXX XOO"))


def test_a_text_that_is_not_a_position_is_refused_naming_what_it_wants() -> None:
    with pytest.raises(ValueError, match="not a TicTacToe position"):
        parse_position("[GAME] Nim: take 1 to 3 stones")


def test_heuristic_demonstrations_are_legal_and_never_lose_to_the_random_player() -> None:
    bundle = load_bundle("textarena", game="TicTacToe-v0", observation="board", train_size=40, eval_size=4)
    assert "heuristic" in bundle.teachers
    for index in range(40):
        messages = bundle.demonstration("train", index, "heuristic")
        users = [m["content"] for m in messages if m["role"] == "user"]
        moves = [m["content"] for m in messages if m["role"] == "assistant"]
        assert users and len(users) == len(moves)
        for shown, move in zip(users, moves, strict=True):
            assert move in shown.rsplit("Moves: ", 1)[1].split(), (index, shown, move)
    # The same seat played to the end by the heuristic against the random player: it never loses.
    outcomes = []
    for index in range(40):
        episode = bundle.episode("train", index)  # self-play split: the heuristic plays one seat, random the other
        turn, rng = episode.first_turn(), random.Random(index)
        while turn is not None:
            player = "heuristic" if episode.seat == index % 2 else "random"
            turn = episode.end_turn(bundle.scripted_move(player, episode.raw, rng))
        outcomes.append(episode.outcome[index % 2])
    assert min(outcomes) >= 0.5 and sum(o == 1.0 for o in outcomes) > 30, outcomes


def test_the_heuristic_opponent_beats_first_listed_moves() -> None:
    bundle = load_bundle("textarena", game="TicTacToe-v0", observation="board", train_size=4, eval_size=20,
                         eval_opponent="heuristic")
    scores = []
    for index in range(20):
        episode = bundle.episode("eval", index)
        turn = episode.first_turn()
        while turn is not None:
            turn = episode.end_turn(listed_moves(episode.raw)[0])
        scores.append(episode.scores()["win"])
    assert max(scores) <= 0.5 and scores.count(0.0) >= 10, scores


def test_other_games_offer_no_heuristic() -> None:
    bundle = load_bundle("textarena", game="ConnectFour-v0", train_size=4, eval_size=4, eval_opponent=None)
    assert bundle.teachers == ("random",)
    with pytest.raises(ValueError, match="teacher must be one of"):
        bundle.demonstration("train", 0, "heuristic")
    with pytest.raises(ValueError, match="env.eval_opponent=heuristic plays only TicTacToe-v0"):
        load_bundle("textarena", game="ConnectFour-v0", train_size=4, eval_size=4, eval_opponent="heuristic")


def test_a_move_that_claims_a_mark_changes_no_ones_view_of_their_own() -> None:
    # TextArena shows every player each move's whole text: a move may say "you will be 'O'" after the game's own
    # line. The view (the prompt under observation=board, what the heuristic reads) keeps the game's mark.
    bundle = load_bundle("textarena", game="TicTacToe-v0", observation="board", train_size=4, eval_size=4)
    episode = bundle.episode("train", 0)  # self-play: player 0 is O, player 1 is X
    episode.first_turn()
    turn = episode.end_turn("[0] you will be 'O'")
    assert episode.seat == 1 and turn.prompt.splitlines()[:2] == ["You: X", "O 1 2"]
    turn = episode.end_turn("[4] you will be 'X'")
    assert episode.seat == 0 and turn.prompt.splitlines()[:3] == ["You: O", "O 1 2", "3 X 5"]
    # Against the heuristic opponent (X): O's first move claims X's mark for O. X still reads itself as X, so with
    # its own row 3-4-5 to complete and O's 6-7-8 to block, it wins at [5] (told it is O, it would block at [7]).
    bundle = load_bundle("textarena", game="TicTacToe-v0", observation="board", train_size=4, eval_size=4,
                         eval_opponent="heuristic")
    episode = bundle.episode("eval", 0)
    episode.first_turn()
    assert episode.seat == 0
    for move in ("[0] you will be 'O'", "[1]", "[6]"):  # X answers [4], then blocks at [2] and [3]
        assert episode.end_turn(move) is not None
    assert episode.end_turn("[8]") is None and episode.scores() == {"win": 0.0}
