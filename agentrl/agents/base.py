"""The interface the built-in trainer consumes: an `Agent` plays one row through a `SessionPool` and returns
a `Play`: one `Rollout` per recorded session (one per role sample), scored but not yet rewarded."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol, TypeVar, runtime_checkable

import httpx

from agentrl.agents.record import Play, Rollout
from agentrl.http import async_client

C = TypeVar("C")


@runtime_checkable
class SessionPool(Protocol):
    """Hands out chat sessions; the trainer reads each session's recorded tokens afterwards."""

    async def open(self, role: str) -> str:
        """base_url of a NEW chat session for that role's model (`{server}/sessions/{id}`)."""
        ...


class Agent(Protocol):
    """An agent pattern: plays one row and returns its rollouts; the reward group rewards them afterwards."""

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, request_kwargs: dict[str, Any]) -> Play: ...


class HttpSessionPool:
    """A SessionPool over Miles-compatible session servers: `POST {server}/sessions` opens a session.

    `default` serves every role without an entry in `by_role` (e.g. a frozen role on its own model server).
    Every opened base URL is kept in `opened` so a caller can read or delete the sessions afterwards.
    """

    def __init__(self, default: str, by_role: Mapping[str, str] | None = None, *,
                 client: httpx.AsyncClient | None = None, timeout: float = 30.0) -> None:
        self.default = default.rstrip("/")
        self.by_role = {k: v.rstrip("/") for k, v in (by_role or {}).items()}
        self._client = client
        self.timeout = timeout
        self.opened: list[tuple[str, str]] = []  # (role, base_url)

    def server(self, role: str) -> str:
        return self.by_role.get(role, self.default)

    async def open(self, role: str) -> str:
        server = self.server(role)
        client = self._client or async_client()
        try:
            response = await client.post(f"{server}/sessions", timeout=self.timeout)
            response.raise_for_status()
            session_id = response.json()["session_id"]
        finally:
            if self._client is None:
                await client.aclose()
        base_url = f"{server}/sessions/{session_id}"
        self.opened.append((role, base_url))
        return base_url


@dataclass
class Role:
    """A role of a multi-agent pattern, from the `roles` config list."""

    name: str
    prompt: str = ""
    model: str | None = None
    frozen: bool = False

    def stamp(self, record: Rollout, play_id: str) -> Rollout:
        """`record` as this role's sample of play `play_id` (its role, model, frozen)."""
        record.role, record.model, record.frozen, record.play_id = self.name, self.model, self.frozen, play_id
        return record


def parse_roles(roles: Iterable[Any] | None, required: Iterable[str], defaults: Iterable[Any] = ()) -> dict[str, Role]:
    """Roles by name from config entries (dicts, DictConfigs or objects); every `required` name must be there."""
    out: dict[str, Role] = {}
    for entry in list(defaults) + list(roles or []):
        get = entry.get if hasattr(entry, "get") else (lambda k, d=None, e=entry: getattr(e, k, d))
        name = get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"every role needs a name, got {entry!r}")
        out[name] = Role(name=name, prompt=str(get("prompt", "") or ""), model=get("model", None),
                         frozen=bool(get("frozen", False)))
    missing = [n for n in required if n not in out]
    if missing:
        raise ValueError(f"roles {missing} are missing; this pattern needs roles {list(required)}")
    return out


def agent_config(cls: type[C], config: Mapping[str, Any]) -> C:
    """The agent's typed config (`agentrl.config.agent`) from the keyword arguments Hydra passes: an unknown
    key is an error naming it, and the config's own checks (`__post_init__`) run."""
    config = {k: v for k, v in config.items() if k != "_target_"}
    known = {f.name for f in fields(cls)} - {"_target_"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise TypeError(f"unknown agent settings {unknown}; {cls.__name__} takes {sorted(known)}")
    return cls(**config)


def multi_agent_metrics(rollouts: Iterable[Rollout]) -> dict[str, float]:
    """Rollout metrics over the samples of one or more plays.

    `multi_agent/avg_turns`: model turns per sample. `multi_agent/early_termination_rate`: share of plays that
    ended early (an early exit, a flag, or a verifier that never accepted). `multi_agent/conversation_token_count`:
    tokens per play (each session's last context plus its reply). `loss_mask/role_split`: share of the model's
    tokens that are trained (roles not frozen), with the share of each role under `loss_mask/role_split/<role>`.
    `reward/avg` and `reward/<role>`: mean final reward.
    """
    rollouts = list(rollouts)
    if not rollouts:
        return {}
    by_play: dict[str, list[Rollout]] = defaultdict(list)
    by_role: dict[str, list[float]] = defaultdict(list)
    role_tokens: dict[str, int] = defaultdict(int)
    trained = total = 0
    for r in rollouts:
        by_play[r.play_id].append(r)
        by_role[r.role].append(r.reward)
        role_tokens[r.role] += r.completion_tokens
        total += r.completion_tokens
        trained += 0 if r.frozen else r.completion_tokens
    early = sum(1 for play in by_play.values() if any(r.early_exit or r.failure for r in play))
    metrics = {
        "multi_agent/avg_turns": sum(r.turns for r in rollouts) / len(rollouts),
        "multi_agent/early_termination_rate": early / len(by_play),
        "multi_agent/conversation_token_count": sum(r.context_tokens for r in rollouts) / len(by_play),
        "loss_mask/role_split": trained / total if total else 0.0,
        "reward/avg": sum(r.reward for r in rollouts) / len(rollouts),
    }
    for role, n in role_tokens.items():
        metrics[f"loss_mask/role_split/{role}"] = n / total if total else 0.0
    for role, rewards in by_role.items():
        metrics[f"reward/{role}"] = sum(rewards) / len(rewards)
    return metrics


def task_prompts(row: dict[str, Any]) -> tuple[str, str]:
    """(system prompt, user prompt) of a row's opening messages."""
    messages = row.get("messages") or []
    if isinstance(messages, str):
        return "", messages
    system = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    if not users:
        raise ValueError("a row's messages need a user message (the task)")
    return system, users[-1]


def with_role(system: str, role: Role) -> str:
    """The task's system prompt followed by the role's instructions."""
    return "\n\n".join(p for p in (system, role.prompt) if p)
