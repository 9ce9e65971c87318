"""The `heuristic` TicTacToe player: win if it can, else block the opponent's win, else the centre, a corner, any.

It reads the current position as `board_view` draws it (`You: O`, three rows of cells, each a mark or the empty
cell's number, and `Moves: [a] [b] ...`) and always answers one of the listed moves, so its demonstrations teach
a small model legal, sensible moves (the `random` teacher's teach only the format).
"""

from __future__ import annotations

import re

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
CENTRE, CORNERS = 4, (0, 2, 6, 8)
_MOVE = re.compile(r"\[(\d+)\]")


def parse_position(view: str) -> tuple[str, list[str], list[int]]:
    """(my mark, the 9 cells: a mark or "" when empty, the listed moves) of a `board_view` text.

    Raises ValueError naming what is missing when the text is not a TicTacToe position."""
    mark, cells, moves = "", [], None
    for line in view.splitlines():
        text = line.strip()
        if text.startswith("You:"):
            mark = text.removeprefix("You:").strip()
        elif text.startswith("Moves:"):
            moves = [int(m) for m in _MOVE.findall(text)]
        elif text:
            cells += ["" if c.isdigit() else c for c in text.split()]
    if not mark or len(cells) != 9 or moves is None:
        raise ValueError(f"not a TicTacToe position (want 'You: <mark>', 3 rows of 3 cells, 'Moves: ...'): {view!r}")
    return mark, cells, moves


def _completing(cells: list[str], mark: str, moves: list[int]) -> int | None:
    """A listed move that completes a line of two `mark`s and one empty cell, or None."""
    for line in LINES:
        marks = [cells[i] for i in line]
        if marks.count(mark) == 2:
            gap = next((i for i in line if not cells[i]), None)
            if gap is not None and gap in moves:
                return gap
    return None


def heuristic_move(view: str) -> str:
    """The heuristic's move for a position (`[k]`, one of its listed moves): win, block, centre, corner, any."""
    mark, cells, moves = parse_position(view)
    if not moves:
        raise ValueError(f"no moves listed in {view!r}")
    others = {c for c in cells if c and c != mark}
    choice = _completing(cells, mark, moves)
    for other in sorted(others):
        if choice is None:
            choice = _completing(cells, other, moves)
    if choice is None:
        choice = next((m for m in (CENTRE, *CORNERS) if m in moves), moves[0])
    return f"[{choice}]"
