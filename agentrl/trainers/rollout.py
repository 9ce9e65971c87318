"""Plays a step's rollouts concurrently: rows -> agent -> session server (tokens) + env server (rewards) -> samples.

The trainer owns one `RolloutRunner`. For each row it starts `n` plays of the run's agent at once (each
play gets its own sampling seed, derived from the run seed, the step and the play's position, so a step's
data is a pure function of the weights and the seed); every session the agent opened becomes one `Sample`
read back from the session server's records (token ids, loss mask, rollout logprobs).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.agents.base import HttpSessionPool, RolloutOutput
from agentrl.http import async_client
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
    policy: str = "main"  # the model that played it, and the only one its sample may update

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
                     "url": env_url, "token_var": env_settings.get("token_var"),
                     "tool_timeout": env_settings.get("tool_timeout", 60.0),
                     "reset_timeout": env_settings.get("reset_timeout", 600.0), "task": dict(info.extra)},
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
    """Plays rows through the agent and turns the recorded sessions into `Played` samples.

    Sessions open on `session_server` unless the role is in `routes` (role -> the session server of its own
    model) or `external` (role -> an OpenAI-compatible base URL, never recorded); `role_policy` names the
    policy each role's samples belong to (default "main").
    """

    def __init__(self, agent: Any, session_server: Any, *, reward_fn: Callable[[dict[str, float]], float],
                 frozen_roles: Sequence[str] = (), routes: Mapping[str, str] | None = None,
                 external: Mapping[str, str] | None = None, role_policy: Mapping[str, str] | None = None) -> None:
        self.agent = agent
        self.base_url = session_server if isinstance(session_server, str) else session_server.base_url
        self.reward_fn = reward_fn
        self.routes = dict(routes or {})
        self.external = dict(external or {})
        self.role_policy = dict(role_policy or {})
        self.frozen_roles = set(frozen_roles) | set(self.external)

    async def play_row(self, row: dict[str, Any], n: int, *, request_kwargs: dict[str, Any],
                       seed_parts: tuple[Any, ...]) -> list[Played]:
        """`n` concurrent plays of `row`; every session becomes a Played (its group: row key + role group)."""
        key = (row["metadata"]["split"], row["metadata"]["index"])

        async def one(j: int) -> list[Played]:
            pool = RoutedSessionPool(self.base_url, self.routes, external=self.external)
            kwargs = dict(request_kwargs)
            if kwargs.get("temperature", 1.0) > 0:
                kwargs["seed"] = play_seed(*seed_parts, *key, j)
            outputs = await self.agent.play(pool, row, reward_fn=self.reward_fn, request_kwargs=kwargs)
            return [await self._to_played(o, row, key) for o in outputs]

        results = await asyncio.gather(*(one(j) for j in range(n)))
        return [p for ps in results for p in ps]

    async def _to_played(self, out: RolloutOutput, row: dict[str, Any], key: tuple[Any, ...]) -> Played:
        meta = out.metadata
        failure = meta.get("agentenv_failure") or meta.get("failure")
        policy = self.role_policy.get(out.role, "main")
        if out.role in self.external:  # an external endpoint records nothing: scored, in its group, never trained
            sample = Sample([], [], [], out.reward, f"{key}/{out.group}", dict(meta))
            return Played(sample, float(out.reward), (*key, out.group), out.role, row, failure, 0, True, dict(meta),
                          policy)
        # Read the session back over HTTP (GET /sessions/{id}), as Miles does, then free it.
        async with async_client() as client:
            response = await client.get(out.base_url, timeout=60)
            response.raise_for_status()
            body = response.json()
            await client.delete(out.base_url, timeout=60)
        if body.get("records"):
            sample = assemble_sample(body, reward=out.reward, group_id=f"{key}/{out.group}", metadata=dict(meta))
        else:  # the play failed before the model's first turn: nothing to train on, still scored 0
            sample = Sample([], [], [], out.reward, f"{key}/{out.group}", dict(meta))
            failure = failure or "no_model_turn"
        invalid = meta.get("agentenv_invalid_calls", 0) or 0
        invalid = len(invalid) if isinstance(invalid, list) else int(invalid)
        frozen = bool(meta.get("frozen")) or out.role in self.frozen_roles
        return Played(sample, float(out.reward), (*key, out.group), out.role, row, failure, invalid, frozen,
                      dict(meta), policy)

    async def play_rows(self, rows: Sequence[dict[str, Any]], n: int, *, request_kwargs: dict[str, Any],
                        seed_parts: tuple[Any, ...]) -> list[list[Played]]:
        """Every row's plays, all rows at once; one list per row, in row order."""
        return list(await asyncio.gather(*(self.play_row(r, n, request_kwargs=request_kwargs,
                                                         seed_parts=seed_parts) for r in rows)))
