"""Plays a step's rollouts concurrently: rows -> agent -> session server (tokens) + env server (rewards) -> samples.

The trainer owns one `RolloutRunner`. For each row it starts `n` plays of the run's agent at once (each
play gets its own sampling seed, derived from the run seed, the step and the play's position, so a step's
data is a pure function of the weights and the seed). The reward group rewards each play's rollouts
(`agentrl.rewards.reward_play`); every session the agent opened is then read back from the session server
(token ids, loss mask, rollout logprobs) into its rollout's `sample`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from agentrl.agents.base import HttpSessionPool
from agentrl.agents.record import Failure, Rollout
from agentrl.config.env import CONNECT_TIMEOUT_S, RESET_TIMEOUT_S, TOOL_TIMEOUT_S
from agentrl.envs.task import opening_turn
from agentrl.http import async_client
from agentrl.inference.sessions.samples import Sample, assemble_sample
from agentrl.play.dependency_breaker import Breaker, play_guarded
from agentrl.play.episode_traces import TraceAs, episode_trace, traced
from agentrl.rewards import RewardGroup, reward_play


def play_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (same parts, same seed, in every process)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def make_row(bundle: Any, split: str, index: int, env_url: str, env_settings: dict[str, Any]) -> dict[str, Any]:
    """A row for task `index` of `split`, served by the env server at `env_url`: the same shape as the rows
    `agentrl.rows` writes for Miles (messages, and metadata with the task and the server's settings). The
    episode that reads the prompt is closed before this returns: the play opens its own on the env server."""
    info = bundle.task_info(split, index)
    turn = opening_turn(bundle, split, index)
    return {
        "messages": [{"role": "system", "content": turn.system_prompt}, {"role": "user", "content": turn.prompt}],
        "metadata": {"split": split, "index": index, "task_id": info.task_id, "tools": turn.tools,
                     "url": env_url, "token_var": env_settings.get("token_var"),
                     "tool_timeout": env_settings.get("tool_timeout", TOOL_TIMEOUT_S),
                     "reset_timeout": env_settings.get("reset_timeout", RESET_TIMEOUT_S),
                     "connect_timeout": env_settings.get("connect_timeout", CONNECT_TIMEOUT_S), "task": dict(info.extra)},
    }


class RoutedSessionPool(HttpSessionPool):
    """An `HttpSessionPool` that also knows external OpenAI-compatible endpoints.

    A role in `external` is handed the endpoint's base URL itself (the agent posts to `{url}/v1/chat/completions`):
    no session is opened there and nothing is recorded, so such a role is played but can never be trained.
    """

    def __init__(self, default: str, by_role: Mapping[str, str] | None = None, *,
                 external: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(default, by_role, **kwargs)
        self.external = {k: v.rstrip("/") for k, v in (external or {}).items()}

    async def open(self, role: str) -> str:
        if role in self.external:
            self.opened.append((role, self.external[role]))
            return self.external[role]
        return await super().open(role)


class RolloutRunner:
    """Plays rows through the agent, rewards the plays, and reads each rollout's recorded session back.

    Sessions open on `session_server` unless the role is in `routes` (role -> the session server of its own
    model) or `external` (role -> an OpenAI-compatible base URL, never recorded); `role_policy` names the
    policy each role's samples belong to (default "main").
    """

    def __init__(self, agent: Any, session_server: Any, *, reward: RewardGroup,
                 frozen_roles: Sequence[str] = (), routes: Mapping[str, str] | None = None,
                 external: Mapping[str, str] | None = None, role_policy: Mapping[str, str] | None = None) -> None:
        self.agent = agent
        self.base_url = session_server if isinstance(session_server, str) else session_server.base_url
        self.reward = reward
        self.routes = dict(routes or {})
        self.external = dict(external or {})
        self.role_policy = dict(role_policy or {})
        self.frozen_roles = set(frozen_roles) | set(self.external)
        self.breaker: Breaker | None = None  # set by start_services: plays stop fast when a dependency dies
        # The run's tracker (`Tracker.log_traces`) when its plays are traced; None: no traces.
        self.traces: Any = None

    async def play_one(self, row: dict[str, Any], j: int, *, request_kwargs: dict[str, Any],
                       seed_parts: tuple[Any, ...], trace_as: TraceAs | None = None) -> list[Rollout]:
        """Play `j` of `row`: its rollouts rewarded, grouped by (row key, role) and recorded; traced (queued
        for the run's tracker) when `trace_as` says what the play is and it is drawn (`traced`)."""
        key = (row["metadata"]["split"], row["metadata"]["index"])
        pool = RoutedSessionPool(self.base_url, self.routes, external=self.external)
        kwargs = dict(request_kwargs)
        if kwargs.get("temperature", 1.0) > 0:
            kwargs["seed"] = play_seed(*seed_parts, *key, j)
        play = await self.agent.play(pool, row, request_kwargs=kwargs)
        rollouts = [await self._record(r, row, key) for r in await reward_play(self.reward, play, row)]
        if trace_as is not None and self.traces is not None and rollouts \
                and traced(trace_as, self.traces.trace_train_fraction, key, j):
            self.traces.log_traces([episode_trace(rollouts, row, j, trace_as)])
        return rollouts

    async def play_row(self, row: dict[str, Any], n: int, *, request_kwargs: dict[str, Any],
                       seed_parts: tuple[Any, ...]) -> list[Rollout]:
        """`n` concurrent plays of `row` (`play_one`), unguarded."""
        results = await asyncio.gather(*(self.play_one(row, j, request_kwargs=request_kwargs, seed_parts=seed_parts)
                                         for j in range(n)))
        return [r for rs in results for r in rs]

    async def _record(self, rollout: Rollout, row: dict[str, Any], key: tuple[Any, ...]) -> Rollout:
        """Fill in what the trainer adds: group, policy, frozen, row and the recorded sample."""
        rollout.group, rollout.row = (*key, rollout.role), row
        rollout.policy = self.role_policy.get(rollout.role, "main")
        rollout.frozen = rollout.frozen or rollout.role in self.frozen_roles
        group_id = f"{key}/{rollout.role}"
        if rollout.role in self.external:  # an external endpoint records nothing: scored, in its group, never trained
            rollout.sample = Sample([], [], [], rollout.reward, group_id, {})
            return rollout
        # Read the session back over HTTP (GET /sessions/{id}), as Miles does, then free it.
        async with async_client() as client:
            response = await client.get(rollout.base_url, timeout=60)
            response.raise_for_status()
            body = response.json()
            await client.delete(rollout.base_url, timeout=60)
        if body.get("records"):
            rollout.sample = assemble_sample(body, reward=rollout.reward, group_id=group_id)
        else:  # the play failed before the model's first turn: nothing to train on, still scored 0
            rollout.sample = Sample([], [], [], rollout.reward, group_id, {})
            rollout.flag(Failure.NO_MODEL_TURN, "the play ended before the model's first turn")
        return rollout

    async def play_rows(self, rows: Sequence[dict[str, Any]], n: int | Sequence[int], *,
                        request_kwargs: dict[str, Any], seed_parts: tuple[Any, ...],
                        trace_as: TraceAs | None = None, ends: list[float] | None = None) -> list[list[Rollout]]:
        """Every row's plays (`n` each, or `n[i]` for row i), all at once; one list per row, in row order.
        `trace_as`: the split and step the plays' traces are tagged with (None: not traced). `ends`, when given,
        gets each play's `time.monotonic()` at its end (the step's long-tail metric, `tail_seconds`).

        Under the run's `breaker` a dependency that dies cuts the plays in flight and stops the call with
        `DependencyLost` (or waits for it and replays what it cut: `agentrl.play.dependency_breaker`).
        """
        counts = [n] * len(rows) if isinstance(n, int) else list(n)
        units = [(i, j) for i, count in enumerate(counts) for j in range(count)]

        async def play(unit: Any) -> list[Rollout]:
            played = await self.play_one(rows[unit[0]], unit[1], request_kwargs=request_kwargs, seed_parts=seed_parts,
                                         trace_as=trace_as)
            if ends is not None:
                ends.append(time.monotonic())
            return played

        done: dict[Hashable, list[Rollout]]
        if self.breaker is None:
            done = dict(zip(units, await asyncio.gather(*(play(u) for u in units)), strict=True))
        else:
            done = await play_guarded(self.breaker, units, play)
        return [[r for j in range(count) for r in done[(i, j)]] for i, count in enumerate(counts)]

