"""Plays a step's rollouts concurrently: rows -> agent -> session server (tokens) + env server (rewards) -> samples.

The trainer owns one `RolloutRunner`. For each row it starts `n` plays of the run's agent at once (each
play gets its own sampling seed, derived from the run seed, the step and the play's position, so a step's
data is a pure function of the weights and the seed); every session the agent opened becomes one `Sample`
read back from the session server's records (token ids, loss mask, rollout logprobs).

When the configured agent does not implement `play` yet, `ToolCallingPlay` plays the episode itself: the
tool-calling loop of contract 1 (chat turn -> tool calls -> env server -> ... -> score).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrl.agents.base import HttpSessionPool, RolloutOutput
from agentrl.agents.chat import ChatError, chat
from agentrl.envs.client import EnvClientError, EpisodeClient
from agentrl.inference.samples import Sample, assemble_sample


@dataclass
class Played:
    """One trainable rollout: its tokens and reward, the group it is normalized in, and what went wrong."""

    sample: Sample
    reward: float
    group: tuple[Any, ...]  # (row key, role group): GRPO normalizes within it
    role: str
    row: dict[str, Any]
    failure: str | None = None  # why the rollout was flagged (env_error, response_truncated, ...)
    invalid_tool_calls: int = 0
    frozen: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def model_tokens(self) -> int:
        return int(sum(self.sample.loss_mask))


def play_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (same parts, same seed, in every process)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def make_row(bundle: Any, split: str, index: int, env_url: str, env_settings: dict[str, Any]) -> dict[str, Any]:
    """A row (contract 5) for task `index` of `split`, served by the env server at `env_url`."""
    info = bundle.task_info(split, index)
    episode = bundle.episode(split, index)
    turn = episode.first_turn()
    return {
        "messages": [{"role": "system", "content": turn.system_prompt}, {"role": "user", "content": turn.prompt}],
        "metadata": {"split": split, "index": index, "task_id": info.task_id, "tools": turn.tools,
                     "env_url": env_url, "env": dict(env_settings), "task": dict(info.extra)},
    }


class ToolCallingPlay:
    """The built-in single-agent play: chat with tools until the episode is done or `max_turns` run out."""

    def __init__(self, *, max_turns: int = 4, max_response_tokens: int = 512, model_timeout: float = 600.0,
                 tool_timeout: float = 60.0) -> None:
        self.max_turns = max_turns
        self.max_response_tokens = max_response_tokens
        self.model_timeout = model_timeout
        self.tool_timeout = tool_timeout

    async def play(self, sessions: Any, row: dict[str, Any], *, reward_fn: Callable[[dict[str, float]], float],
                   request_kwargs: dict[str, Any]) -> list[RolloutOutput]:
        meta = row["metadata"]
        base_url = await sessions.open("agent")
        failure: str | None = None
        invalid = turns = 0
        scores: dict[str, float] = {}
        env_s = 0.0
        async with httpx.AsyncClient(trust_env=False) as client, \
                EpisodeClient(meta["env_url"], tool_timeout=self.tool_timeout) as env:
            try:
                t0 = time.monotonic()
                prompt, system, tools = await env.reset(meta["split"], meta["index"])
                env_s += time.monotonic() - t0
                messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                                  {"role": "user", "content": prompt}]
                done = False
                while not done and turns < self.max_turns:
                    reply = await chat(client, base_url, messages, tools=tools, request_kwargs=request_kwargs,
                                       max_tokens=self.max_response_tokens, timeout=self.model_timeout)
                    turns += 1
                    messages.append(reply.message)
                    invalid += reply.content.count("<tool_call>")  # blocks the server could not parse
                    if reply.finish_reason == "length":
                        failure = "response_truncated"
                        break
                    t0 = time.monotonic()
                    if not reply.tool_calls:
                        result = await env.end_turn(reply.content)
                        done = result.done
                        scores = result.scores or scores
                    for call in reply.tool_calls:
                        fn = call.get("function", {})
                        try:
                            args = json.loads(fn.get("arguments") or "{}")
                        except ValueError:
                            args = None
                        if not isinstance(args, dict):
                            invalid += 1
                            args = {}
                        result = await env.call(fn.get("name", ""), args)
                        invalid += int(result.error_type in ("tool_not_found", "invalid_args"))
                        failure = failure or result.failure
                        scores = result.scores or scores
                        messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
                                         "content": result.text})
                        if result.done:
                            done = True
                            break
                    env_s += time.monotonic() - t0
            except ChatError as exc:
                failure = exc.failure
            except EnvClientError as exc:
                failure = f"env_error:{type(exc).__name__}"
        reward = 0.0 if failure or not scores else float(reward_fn(scores))
        out_meta = {"scores": scores, "agentenv_turns": turns, "agentenv_failure": failure,
                    "invalid_tool_calls": invalid, "env_s": env_s}
        return [RolloutOutput(base_url, "agent", reward, out_meta, "agent")]


class RolloutRunner:
    """Plays rows through the agent over one session server and turns the sessions into `Played` samples."""

    def __init__(self, agent: Any, session_server: Any, *, reward_fn: Callable[[dict[str, float]], float],
                 frozen_roles: Sequence[str] = ()) -> None:
        self.agent = agent
        self.base_url = session_server if isinstance(session_server, str) else session_server.base_url
        self.reward_fn = reward_fn
        self.frozen_roles = set(frozen_roles)

    async def play_row(self, row: dict[str, Any], n: int, *, request_kwargs: dict[str, Any],
                       seed_parts: tuple[Any, ...]) -> list[Played]:
        """`n` concurrent plays of `row`; every session becomes a Played (its group: row key + role group)."""
        key = (row["metadata"]["split"], row["metadata"]["index"])

        async def one(j: int) -> list[Played]:
            pool = HttpSessionPool(self.base_url)
            kwargs = dict(request_kwargs)
            if kwargs.get("temperature", 1.0) > 0:
                kwargs["seed"] = play_seed(*seed_parts, *key, j)
            outputs = await self.agent.play(pool, row, reward_fn=self.reward_fn, request_kwargs=kwargs)
            return [await self._to_played(o, row, key) for o in outputs]

        results = await asyncio.gather(*(one(j) for j in range(n)))
        return [p for ps in results for p in ps]

    async def _to_played(self, out: RolloutOutput, row: dict[str, Any], key: tuple[Any, ...]) -> Played:
        # Read the session back over HTTP (GET /sessions/{id}), as Miles does, then free it.
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(out.base_url, timeout=60)
            response.raise_for_status()
            sample = assemble_sample(response.json(), reward=out.reward, group_id=f"{key}/{out.group}",
                                     metadata=dict(out.metadata))
            await client.delete(out.base_url, timeout=60)
        meta = out.metadata
        failure = meta.get("agentenv_failure") or meta.get("failure")
        invalid = int(meta.get("invalid_tool_calls", 0) or 0)
        if isinstance(meta.get("invalid_calls"), list):
            invalid = max(invalid, len(meta["invalid_calls"]))
        frozen = bool(meta.get("frozen")) or out.role in self.frozen_roles
        return Played(sample, float(out.reward), (*key, out.group), out.role, row, failure, invalid, frozen,
                      dict(meta))

    async def play_rows(self, rows: Sequence[dict[str, Any]], n: int, *, request_kwargs: dict[str, Any],
                        seed_parts: tuple[Any, ...]) -> list[list[Played]]:
        """Every row's plays, all rows at once; one list per row, in row order."""
        return list(await asyncio.gather(*(self.play_row(r, n, request_kwargs=request_kwargs,
                                                         seed_parts=seed_parts) for r in rows)))
