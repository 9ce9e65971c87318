"""`env=textarena`: a TextArena game (`env.game`, e.g. TicTacToe-v0) as a bundle of seeded matches.

An episode is one match. Each of its turns is one player's move: the turn's prompt is that player's
TextArena observation and its system prompt starts `You are Player <n>` (the seat: `agent=self_play` keys
its roles by it); the reply (ending the turn) is the move. A split either lets the agent play every seat
(self-play; the match scores `win_p0`, player 0's outcome) or seats a scripted opponent (`random` or
`first`: a move listed in the observation's `Available Moves`; TicTacToe also `heuristic`: win, block, centre,
corner, `tictactoe.py`) and the agent plays the other seat,
alternating seats by task index (the match scores `win`, the agent's outcome). Outcomes are 1 win, 0.5 draw,
0 loss, from TextArena's own rewards. The SFT teachers: `random` (random listed moves: the format, not skill)
and, for TicTacToe, `heuristic` (legal and sensible moves).

A turn's prompt is the player's observation (`observation=full`: TextArena's whole running transcript, its last
`prompt_chars` characters when set) or only the current position (`observation=board`: the player's mark, the
last board drawn without its grid lines, and the available moves: ~40 tokens for TicTacToe instead of a
transcript that grows by ~150 tokens a move), for a small model's short context.
"""

from __future__ import annotations

import random
import re
from typing import Any

from agentrl.envs.bundles.textarena.tictactoe import heuristic_move
from agentrl.envs.task import Bundle, Episode, TaskInfo, ToolResult, Turn

OPPONENTS = ("random", "first", "heuristic")
# Games the `heuristic` player (teacher and scripted opponent) knows; it reads a 3x3 board.
HEURISTIC_GAMES = ("TicTacToe-v0",)
OBSERVATIONS = ("full", "board")
_MARK = re.compile(r"you will be '([^']+)'")
_MOVE = re.compile(r"'(\[[^\]]*\])'")
SYSTEM = ("You are Player {seat} in the game {game}. Read the game's messages and reply with your next move "
          "only, in the format the game asks for.")


def listed_moves(observation: str) -> list[str]:
    """The moves an observation lists after its last `Available Moves:` (TicTacToe and its like)."""
    _, found, tail = observation.rpartition("Available Moves:")
    return _MOVE.findall(tail.split("\n", 1)[0]) if found else []


def board_view(observation: str) -> str | None:
    """The current position of an observation: `You: <mark>` (when the game says it), the last board drawn after
    `Current Board:` with its grid lines dropped and cells space-separated, and `Moves: [a] [b] ...`; None when
    the observation draws no board."""
    _, found, tail = observation.rpartition("Current Board:")
    if not found:
        return None
    # The game says it first (the player's opening prompt); a later "you will be 'X'" is some move's free text,
    # which TextArena shows every player: read from there it would let one seat rename another's mark.
    mark = _MARK.search(observation)
    lines = [f"You: {mark.group(1)}"] if mark else []
    for line in tail.splitlines():
        text = line.strip()
        if not text or set(text) <= set("-+|="):
            continue
        if text.startswith("Available Moves:"):
            lines.append("Moves: " + " ".join(listed_moves(text)))
            break
        if text.startswith("["):  # a later message ("[Player 1] ...", "[GAME] ..."): the board has ended
            break
        lines.append(" ".join(cell.strip() for cell in text.split("|")))
    return "\n".join(lines)


def make_game(game: str) -> Any:
    import textarena as ta

    try:
        return ta.make(game)
    except ValueError as exc:
        raise ValueError(f"env.game={game!r}: {exc} (e.g. TicTacToe-v0, ConnectFour-v0, Nim-v0)") from None


class TextArenaEpisode(Episode):
    """One seeded match; the scripted opponent's moves are made inside the episode."""

    def __init__(self, bundle: TextArenaBundle, seed: int, info: TaskInfo, opponent: str | None,
                 agent_seat: int | None) -> None:
        self.bundle, self.info = bundle, info
        self.game = make_game(bundle.game)
        self.game.reset(num_players=bundle.num_players, seed=seed)
        self.opponent, self.agent_seat = opponent, agent_seat
        self.rng = random.Random(seed)
        self.outcome: dict[int, float] | None = None
        self.seat: int | None = None
        self.observation = ""  # what the agent was shown (the turn's prompt)
        self.raw = ""  # TextArena's observation behind it (its listed moves: the demonstrations' choices)

    def _agent_plays(self, seat: int) -> bool:
        return self.opponent is None or seat == self.agent_seat

    def _advance(self, done: bool = False) -> Turn | None:
        """Play the opponent's moves until an agent seat is to move (its Turn) or the match is over (None)."""
        while not done:
            seat, observation = self.game.get_observation()
            if self._agent_plays(seat):
                self.seat, self.raw, self.observation = seat, observation, self.bundle.shown(observation)
                system = SYSTEM.format(seat=seat, game=self.bundle.game)
                return Turn(prompt=self.observation, system_prompt=system, tools=[])
            done, _ = self.game.step(self.bundle.scripted_move(str(self.opponent), observation, self.rng))
        rewards, _ = self.game.close()
        self.outcome = {int(p): (float(r) + 1.0) / 2.0 for p, r in rewards.items()}
        return None

    def first_turn(self) -> Turn:
        turn = self._advance()
        if turn is None:
            raise RuntimeError(f"the match of {self.bundle.game} ended before the agent moved")
        return turn

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(f"there are no tools in {self.bundle.game}: reply with your move", is_error=True)

    def end_turn(self, response: str) -> Turn | None:
        if self.outcome is not None:
            return None
        done, _ = self.game.step((response or "").strip())
        return self._advance(done)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def scores(self) -> dict[str, float]:
        if self.outcome is None:
            return {}
        if self.opponent is None:
            return {"win_p0": self.outcome[0]}
        return {"win": self.outcome[int(self.agent_seat or 0)]}


class TextArenaBundle(Bundle):
    """Seeded matches of one TextArena game: a train split and an eval split, each self-play or vs a script."""

    name = "textarena"
    version = "1"
    # SFT demonstrations: a seat playing random listed moves (the format, not skill); TicTacToe adds `heuristic`
    teachers: tuple[str, ...] = ("random",)
    eval_breakdown = {"seat": "reward_seat{}"}  # eval/reward_seat0, eval/reward_seat1 (vs a scripted opponent)
    eval_strata = "seat"

    def __init__(self, game: str = "TicTacToe-v0", *, num_players: int = 2, train_size: int = 256,
                 eval_size: int = 64, seed: int = 0, train_opponent: str | None = None,
                 eval_opponent: str | None = "random", prompt_chars: int | None = None, observation: str = "full",
                 train_split: str = "train", eval_split: str = "eval") -> None:
        for key, value in (("train_opponent", train_opponent), ("eval_opponent", eval_opponent)):
            if value is not None and value not in OPPONENTS:
                raise ValueError(f"env.{key}={value!r}: choose one of {', '.join(OPPONENTS)}, or null (self-play)")
            if value == "heuristic" and game not in HEURISTIC_GAMES:
                raise ValueError(f"env.{key}=heuristic plays only {', '.join(HEURISTIC_GAMES)}, not env.game={game}")
        self.teachers = ("random", "heuristic") if game in HEURISTIC_GAMES else ("random",)
        if min(train_size, eval_size) < 1:
            raise ValueError("env.train_size and env.eval_size must be >= 1")
        if observation not in OBSERVATIONS:
            raise ValueError(f"env.observation={observation!r}: choose one of {', '.join(OBSERVATIONS)}")
        self.observation = observation
        self.game, self.num_players = game, int(num_players)
        self.options = {"game": game, "num_players": num_players, "train_size": train_size, "eval_size": eval_size,
                        "seed": seed, "train_opponent": train_opponent, "eval_opponent": eval_opponent,
                        "prompt_chars": prompt_chars, "observation": observation}
        if prompt_chars is not None and int(prompt_chars) < 1:
            raise ValueError(f"env.prompt_chars must be >= 1 (or null: the whole observation), not {prompt_chars}")
        self.prompt_chars = None if prompt_chars is None else int(prompt_chars)
        self.train_split, self.eval_split = train_split, eval_split
        self._sizes = {train_split: int(train_size), eval_split: int(eval_size)}
        self._opponents = {train_split: train_opponent, eval_split: eval_opponent}
        # Eval seeds follow the train seeds: no match is in both splits.
        self._seeds = {train_split: int(seed), eval_split: int(seed) + int(train_size)}
        self._probe(train_opponent or eval_opponent)

    def scripted_move(self, player: str, observation: str, rng: random.Random) -> str:
        """The move of a scripted `player` (an opponent or a teacher) for a TextArena observation: `first` the first
        listed move, `random` a random one (drawn from `rng`), `heuristic` win/block/centre/corner/any."""
        moves = listed_moves(observation) or ["[0]"]
        if player == "first":
            return moves[0]
        if player == "heuristic":
            return heuristic_move(board_view(observation) or "")
        return rng.choice(moves)

    def shown(self, observation: str) -> str:
        """What a turn's prompt shows of an observation: the current position (`observation=board`), else its
        last `prompt_chars` characters (the board and the moves, for TicTacToe: a small model's context cannot
        hold every turn's rules and boards), or all."""
        if self.observation == "board":
            return board_view(observation) or observation
        if self.prompt_chars is None or len(observation) <= self.prompt_chars:
            return observation
        return "..." + observation[-self.prompt_chars:]

    def _probe(self, opponent: str | None) -> None:
        """Fail now, naming the setting, for an unknown game, a player count it refuses, or a scripted opponent
        in a game whose observations list no moves."""
        game = make_game(self.game)
        try:
            game.reset(num_players=self.num_players, seed=0)
        except (AssertionError, ValueError, TypeError) as exc:
            raise ValueError(f"env.game={self.game} refuses env.num_players={self.num_players}: {exc}") from None
        _, observation = game.get_observation()
        if self.observation == "board" and board_view(observation) is None:
            raise ValueError(f"env.game={self.game} draws no 'Current Board:' for env.observation=board; "
                             "use env.observation=full")
        if opponent is not None and not listed_moves(observation):
            raise ValueError(f"env.game={self.game} lists no 'Available Moves' for a scripted opponent "
                             f"(env.train_opponent / env.eval_opponent); use null (self-play)")

    def splits(self) -> dict[str, int]:
        return dict(self._sizes)

    def _check(self, split: str, index: int) -> None:
        if split not in self._sizes:
            raise KeyError(f"bundle textarena has no split {split!r}; it has {sorted(self._sizes)}")
        if not isinstance(index, int) or not 0 <= index < self._sizes[split]:
            raise IndexError(f"split {split!r} has no task {index!r} (0..{self._sizes[split] - 1})")

    def _seat(self, split: str, index: int) -> int | None:
        return index % self.num_players if self._opponents[split] is not None else None

    def task_info(self, split: str, index: int) -> TaskInfo:
        self._check(split, index)
        seat = self._seat(split, index)
        return TaskInfo(task_id=f"{self.game}-{split}-{index:05d}", split=split, index=index,
                        extra={"seat": seat, "opponent": self._opponents[split]})

    def episode(self, split: str, index: int) -> TextArenaEpisode:
        info = self.task_info(split, index)
        return TextArenaEpisode(self, self._seeds[split] + index, info, self._opponents[split],
                                self._seat(split, index))

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        """Seat `index % num_players` of the match played by `teacher` (random listed moves, or the heuristic)
        against the random opponent: its whole conversation (system, then each observation and move)."""
        if teacher not in self.teachers:
            raise ValueError(f"textarena teacher must be one of {self.teachers}, not {teacher!r}")
        info = self.task_info(split, index)
        seat = index % self.num_players
        episode = TextArenaEpisode(self, self._seeds[split] + index, info, "random", seat)
        rng = random.Random(f"demo-{split}-{index}")
        turn: Turn | None = episode.first_turn()
        messages: list[dict[str, Any]] = [{"role": "system", "content": turn.system_prompt}]
        while turn is not None:
            move = self.scripted_move(teacher, episode.raw, rng)
            messages += [{"role": "user", "content": turn.prompt}, {"role": "assistant", "content": move}]
            turn = episode.end_turn(move)
        return messages

    def spec(self) -> dict[str, Any]:
        return {"bundle": "textarena", "train_split": self.train_split, "eval_split": self.eval_split,
                **self.options}

    def data_options(self) -> dict[str, Any]:
        return dict(self.options)
