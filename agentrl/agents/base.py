"""The interface the built-in trainer consumes: an `Agent` plays one row through a `SessionPool` and returns
`RolloutOutput`s, one per recorded session (one per role sample)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

from agentrl.http import async_client

RewardFn = Callable[[dict[str, float]], float]


@runtime_checkable
class SessionPool(Protocol):
    """Hands out chat sessions; the trainer reads each session's recorded tokens afterwards."""

    async def open(self, role: str) -> str:
        """base_url of a NEW chat session for that role's model (`{server}/sessions/{id}`)."""
        ...


@dataclass
class RolloutOutput:
    """One trainable sample: the session whose recorded tokens form it, and its reward."""

    base_url: str  # the session whose recorded tokens form this sample
    role: str  # "agent" for tool_calling; solver/rewriter/selector, thinker/verifier, proposer/solver
    reward: float  # the final trained reward (reward group applied, weights applied, 0 when flagged)
    metadata: dict[str, Any]  # everything the agent function returned, plus role, frozen, play id
    group: str = ""  # samples with the same (row, group) are normalized together by GRPO


class Agent(Protocol):
    """An agent pattern: plays one row and returns the samples it produced."""

    async def play(
        self, sessions: SessionPool, row: dict[str, Any], *, reward_fn: RewardFn, request_kwargs: dict[str, Any]
    ) -> list[RolloutOutput]: ...


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


@dataclass
class PlaySettings:
    """The agent config fields every pattern shares (see `agentrl.config.agent.AgentConfig`)."""

    max_turns: int = 4
    max_context_tokens: int | None = 4096
    max_response_tokens: int | None = 512
    model_timeout: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def split(cls, config: Mapping[str, Any], allowed: Iterable[str]) -> PlaySettings:
        """Shared settings from `config`; keys in `allowed` go to `extra`; anything else is an error."""
        config = dict(config)
        config.pop("_target_", None)
        own = {k: config.pop(k) for k in ("max_turns", "max_context_tokens", "max_response_tokens", "model_timeout")
               if k in config}
        allowed = set(allowed)
        unknown = sorted(k for k in config if k not in allowed)
        if unknown:
            raise TypeError(f"unknown agent settings {unknown}; this agent takes {sorted(allowed | own.keys())}")
        settings = cls(**own, extra=config)
        if settings.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, not {settings.max_turns}")
        return settings

    def run_kwargs(self) -> dict[str, Any]:
        return {"max_turns": self.max_turns, "max_context_tokens": self.max_context_tokens,
                "max_response_tokens": self.max_response_tokens, "model_timeout": self.model_timeout}


def new_play_id() -> str:
    return uuid.uuid4().hex[:16]


def multi_agent_metrics(outputs: Iterable[RolloutOutput]) -> dict[str, float]:
    """Rollout metrics over the samples of one or more plays.

    `multi_agent/avg_turns`: model turns per sample. `multi_agent/early_termination_rate`: share of plays that
    ended early (an early exit, a flag, or a verifier that never accepted). `multi_agent/conversation_token_count`:
    tokens per play (each session's last context plus its reply). `loss_mask/role_split`: share of the model's
    tokens that are trained (roles not frozen), with the share of each role under `loss_mask/role_split/<role>`.
    `reward/avg` and `reward/<role>`: mean final reward.
    """
    outputs = list(outputs)
    if not outputs:
        return {}
    by_play: dict[str, list[RolloutOutput]] = defaultdict(list)
    by_role: dict[str, list[float]] = defaultdict(list)
    role_tokens: dict[str, int] = defaultdict(int)
    trained = total = 0
    for o in outputs:
        by_play[str(o.metadata.get("agentenv_play_id", id(o)))].append(o)
        by_role[o.role].append(o.reward)
        n = int(o.metadata.get("agentenv_completion_tokens", 0) or 0)
        role_tokens[o.role] += n
        total += n
        trained += 0 if o.metadata.get("frozen") else n
    early = sum(
        1 for group in by_play.values()
        if any(o.metadata.get("agentenv_early_exit") or o.metadata.get("agentenv_failure") for o in group)
    )
    metrics = {
        "multi_agent/avg_turns": sum(int(o.metadata.get("agentenv_turns", 0) or 0) for o in outputs) / len(outputs),
        "multi_agent/early_termination_rate": early / len(by_play),
        "multi_agent/conversation_token_count": sum(
            int(o.metadata.get("agentenv_context_tokens", 0) or 0) for o in outputs) / len(by_play),
        "loss_mask/role_split": trained / total if total else 0.0,
        "reward/avg": sum(o.reward for o in outputs) / len(outputs),
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


def role_output(base_url: str, role: Role, reward: float, metadata: dict[str, Any], play_id: str,
                weight: float = 1.0) -> RolloutOutput:
    """A multi-agent sample: `reward` × `weight` (0 when flagged), the role in metadata, grouped by role."""
    raw = 0.0 if metadata.get("agentenv_failure") else float(reward)
    final = raw * weight
    meta = {**metadata, "reward": final, "role": role.name, "frozen": role.frozen, "agentenv_play_id": play_id,
            "agentenv_raw_reward": raw, "agentenv_weight": weight}
    if role.model:
        meta["model"] = role.model
    return RolloutOutput(base_url=base_url, role=role.name, reward=final, metadata=meta, group=role.name)


def reward_weight(reward_fn: Any, selected_reward: float | None) -> float:
    """The reward group's weight for an outcome (`Asymmetric.weight`); 1.0 for groups without weights."""
    weight = getattr(reward_fn, "weight", None)
    return float(weight(selected_reward)) if callable(weight) else 1.0
