"""Self-play (`agent=self_play`): every seat of a multi-player game, one role per seat, one env episode.

The env (env=textarena) opens each turn for one seat: its system prompt starts `You are Player <n>`, and its
prompt is that player's view. Seat n is played by the n-th role in `roles`, each in its own conversation (it
sees only its own player's messages); the reply ends the turn and is the move. A seat the env does not ask
for (a scripted opponent's) has no rollout. When the match ends, each seat's rollout scores its own outcome
(`win`: 1 win, 0.5 draw, 0 loss): the env's `win` is the one seat's outcome, `win_p0` player 0's, so player
1's is `1 - win_p0` (two-player, zero-sum). Failures flag every seat's rollout: a cut-short match has no fair
outcome.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from agentrl.agents.base import SessionPool, agent_config, parse_roles, with_role
from agentrl.agents.chat import role_turn, vary_seed
from agentrl.agents.episode import env_failure, episode_client
from agentrl.agents.record import Failure, Play, Rollout
from agentrl.config.agent import SelfPlayAgentConfig
from agentrl.envs.client import EnvClientError, EpisodeClient
from agentrl.http import async_client

_SEAT = re.compile(r"^You are Player (\d+)\b")


def seat_of(system_prompt: str | None) -> int | None:
    """The seat a turn is for, from its system prompt (`You are Player <n> ...`); None when it names none."""
    match = _SEAT.match(system_prompt or "")
    return int(match.group(1)) if match else None


class SelfPlayAgent:
    """Plays one match: a rollout per seat the agent played, each scored by its own outcome."""

    def __init__(self, **config: Any) -> None:
        self.settings = agent_config(SelfPlayAgentConfig, config)
        entries = [asdict(r) if hasattr(r, "__dataclass_fields__") else r for r in self.settings.roles]
        names = [e.get("name") if hasattr(e, "get") else getattr(e, "name", None) for e in entries]
        self.roles = list(parse_roles(entries, names).values())

    def plan_problem(self, bundle: Any) -> str | None:
        """Why this agent cannot play `bundle` (checked when the run is planned), or None: a game with more
        seats (`num_players`) than `agent.roles` has roles."""
        seats = getattr(bundle, "num_players", None)
        if isinstance(seats, int) and seats > len(self.roles):
            return (f"agent.roles has {len(self.roles)} role(s) ({', '.join(r.name for r in self.roles)}) but the "
                    f"game has {seats} seats (env.num_players): add a role per seat")
        return None

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, request_kwargs: dict[str, Any]) -> Play:
        metadata = row.get("metadata") or {}
        s = self.settings
        turn_kw = {"max_response_tokens": s.max_response_tokens, "max_context_tokens": s.max_context_tokens,
                   "timeout": s.model_timeout}
        play_id = Rollout().play_id
        seats: dict[int, tuple[Rollout, list[dict[str, Any]]]] = {}
        fallback = self.roles[0].stamp(Rollout(), play_id)  # carries a failure before any seat played

        def flag(failure: Failure, error: str) -> Play:
            records = [r for r, _ in seats.values()] or [fallback]
            for record in records:
                record.flag(failure, error)
            return Play(records)

        async def open_seat(seat: int, system: str, prompt: str) -> tuple[Rollout, list[dict[str, Any]]] | str:
            if seat >= len(self.roles):
                return (f"the game asks for player {seat} but agent.roles has {len(self.roles)} role(s) "
                        f"({', '.join(r.name for r in self.roles)}): add a role per seat")
            if seat not in seats:
                role = self.roles[seat]
                record = role.stamp(Rollout(base_url=await sessions.open(role.name)), play_id)
                seats[seat] = (record, [{"role": "system", "content": with_role(system, role)}])
            seats[seat][1].append({"role": "user", "content": prompt})
            return seats[seat]

        env: EpisodeClient | None = None
        try:
            env = episode_client(metadata)
            try:
                prompt, system, _ = await env.reset(str(metadata["split"]), int(metadata["index"]))
            except EnvClientError as exc:
                return flag(env_failure(exc, started=False), str(exc))
            async with async_client() as client:
                for _ in range(int(s.max_turns)):
                    seat = seat_of(system)
                    if seat is None:
                        return flag(Failure.ENV_ERROR, "the env's turn names no seat ('You are Player <n>'): "
                                                       "agent=self_play plays env=textarena")
                    opened = await open_seat(seat, system, prompt)
                    if isinstance(opened, str):
                        return flag(Failure.AGENT_ERROR, opened)
                    record, messages = opened
                    # each seat samples with its own seed: two seats on one seed would draw alike
                    reply = await role_turn(client, record.base_url, messages, record,
                                            request_kwargs=vary_seed(request_kwargs, "session", seat), **turn_kw)
                    if reply is None:  # the model failed this seat: the match has no fair outcome
                        return flag(record.failure or Failure.MODEL_ERROR, record.error)
                    try:
                        result = await env.end_turn(reply.content)
                    except EnvClientError as exc:
                        return flag(env_failure(exc, started=True), str(exc))
                    if result.failure or result.is_error:
                        return flag(Failure.of(result.failure or "env_error"), result.text)
                    if result.done:
                        return self._score(seats, result.scores)
                    prompt, system = result.prompt or "", result.system_prompt or ""
                return flag(Failure.MAX_TURNS, f"the match wanted more than agent.max_turns={s.max_turns} moves")
        except Exception as exc:  # noqa: BLE001 - a bug here flags the play, it never kills the rollout loop
            return flag(Failure.AGENT_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            if env is not None:
                await env.close()

    @staticmethod
    def _score(seats: dict[int, tuple[Rollout, list[dict[str, Any]]]], scores: dict[str, float]) -> Play:
        records = [seats[k][0] for k in sorted(seats)]
        if "win" in scores and len(seats) == 1:
            outcomes = {next(iter(seats)): float(scores["win"])}
        elif "win_p0" in scores:
            outcomes = {0: float(scores["win_p0"]), 1: 1.0 - float(scores["win_p0"])}
        else:
            for record in records:
                record.flag(Failure.NO_REWARD, f"the match scored {sorted(scores)}, not win or win_p0")
            return Play(records)
        for seat, (record, _) in seats.items():
            record.scores = {"win": outcomes.get(seat, 0.0)}
            record.env_reward = record.scores["win"]
            record.details["seat"] = seat
        return Play(records)
