"""The tool-calling agent (`agent=tool_calling`): one model plays the row's episode with its tools.

`ToolCallingAgent.play` is what the built-in trainer calls; `run` is Miles' agent function
(`--custom-agent-function-path agentrl.agents.tool_calling.run`), the same episode returned as the AgentEnv
metadata dict. Both play through the episode kernel, `agentrl.agents.episode.play_episode`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.agents.base import SessionPool, agent_config
from agentrl.agents.episode import play_episode
from agentrl.agents.record import Failure, Play, miles_metadata
from agentrl.config.agent import ToolCallingAgentConfig

_ENV_SETTINGS = ("tool_timeout", "reset_timeout", "connect_timeout")


def row_settings(metadata: Mapping[str, Any], request_kwargs: Mapping[str, Any], **overrides: Any
                 ) -> ToolCallingAgentConfig:
    """The settings of an episode Miles plays: the row's (`max_turns`, `model_timeout`, Miles' `max_seq_len`)
    and the request's `max_tokens`, under explicit `overrides`; budgets are off where none is given."""
    given = {"max_turns": metadata.get("max_turns"), "max_context_tokens": metadata.get("max_seq_len"),
             "max_response_tokens": request_kwargs.get("max_tokens"), "model_timeout": metadata.get("model_timeout")}
    given.update({k: v for k, v in overrides.items() if v is not None})
    defaults = ToolCallingAgentConfig()
    return ToolCallingAgentConfig(
        max_turns=int(given["max_turns"] or defaults.max_turns),
        max_context_tokens=given["max_context_tokens"], max_response_tokens=given["max_response_tokens"],
        model_timeout=float(given["model_timeout"] or defaults.model_timeout))


async def run(base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any],
              **kw: Any) -> dict[str, Any]:
    """Miles' agent function: play the row's episode and return the AgentEnv metadata dict (`reward` is the
    env's own reward, 0 when flagged; `agentenv_scores`, counts, `agentenv_failure`/`agentenv_error`).

    Keyword settings (`max_turns`, `max_context_tokens`, `max_response_tokens`, `model_timeout`, and the env
    server's `tool_timeout`, `reset_timeout`, `connect_timeout`) override the row's; `http_client` reuses an
    httpx.AsyncClient.
    """
    request_kwargs = dict(request_kwargs or {})
    client = kw.pop("http_client", None)
    # The env server's settings travel in the row; keyword ones replace them.
    metadata = {**(metadata or {}), **{k: kw.pop(k) for k in _ENV_SETTINGS if kw.get(k) is not None}}
    settings = row_settings(metadata, request_kwargs, **kw)
    record = await play_episode(base_url, prompt, request_kwargs, metadata, settings, http_client=client)
    if record.failure is None and record.env_reward is None:
        record.flag(Failure.NO_REWARD, f"the episode ended without a reward (scores {record.scores})")
    record.score = record.reward = 0.0 if record.failure else float(record.env_reward or 0.0)
    return miles_metadata(record)


class ToolCallingAgent:
    """`agent=tool_calling`: one session (role "agent") plays the row's episode."""

    role = "agent"

    def __init__(self, **config: Any) -> None:
        self.settings = agent_config(ToolCallingAgentConfig, config)

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, request_kwargs: dict[str, Any]) -> Play:
        """Open one session and play the row: one rollout, scored by the env (the reward group rewards it)."""
        base_url = await sessions.open(self.role)
        record = await play_episode(base_url, row.get("messages"), request_kwargs, row.get("metadata") or {},
                                    self.settings, role=self.role)
        return Play([record])
