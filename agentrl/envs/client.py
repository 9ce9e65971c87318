"""`EpisodeClient`: the async client agents use to play one episode at a time on an env server.

It speaks the OpenEnv `/ws` protocol (any OpenEnv server that carries metadata in its observations
works). A reset waits for room on a full server, and for one that answers 503 while it restarts, until
`reset_timeout`; but when nothing listens at the URL at all (connection refused, unknown host, no
route), or the process there never answers the handshake (frozen), it gives up after `connect_timeout`
with `EnvUnreachableError`. Every failure is a typed
`EnvClientError`, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tenacity import AsyncRetrying, retry_if_exception_type
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from agentrl.config.env import CONNECT_TIMEOUT_S, RESET_TIMEOUT_S, TOOL_TIMEOUT_S
from agentrl.envs import strict_json
from agentrl.envs.connection import (
    Deadlines,
    EnvAuthError,
    EnvClientError,
    EnvConnectionError,
    EnvProtocolError,
    EnvResetError,
    EnvTimeoutError,
    EnvUnreachableError,
    Retry,
    open_connection,
)

__all__ = [
    "CallResult", "EnvAuthError", "EnvClientError", "EnvConnectionError", "EnvProtocolError", "EnvResetError",
    "EnvTimeoutError", "EnvUnreachableError", "EpisodeClient", "openai_tool", "ws_url",
]

# Extra seconds the client waits beyond the server's own tool timeout before giving up on a reply.
REPLY_GRACE_S = 15.0


@dataclass
class CallResult:
    """The answer to a tool call or `end_turn`."""

    text: str
    is_error: bool = False
    done: bool = False
    reward: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # The protocol's tool error type (tool_not_found, invalid_args, execution_error, timeout, ...).
    error_type: str | None = None
    # Why the episode was flagged (tool_timeout, sandbox_error, env_error, reward_error, ...); None if fine.
    failure: str | None = None
    # Set when `end_turn` opened another turn: its prompts and tools (OpenAI function schemas).
    prompt: str | None = None
    system_prompt: str | None = None
    tools: list[dict[str, Any]] | None = None


def ws_url(url: str) -> str:
    """`http(s)://host:port[/prefix]` -> `ws(s)://host:port[/prefix]/ws` (an existing `/ws` is kept)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"an env server URL must be http(s) or ws(s), not {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/ws"):
        path += "/ws"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool (`input_schema` or `inputSchema`) as an OpenAI function schema."""
    schema = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": tool.get("description") or "", "parameters": schema},
    }


class EpisodeClient:
    """One connection to an env server, playing one episode after another.

    `async with EpisodeClient(url) as env: prompt, system, tools = await env.reset("eval", 3)`.
    `reset_timeout` bounds a reset's wait for room (or for a restarting server); `connect_timeout`
    bounds how long it keeps trying while nothing listens at `url` (then `EnvUnreachableError`);
    `tool_timeout` is the server's per-call deadline (the client waits a little longer).
    """

    def __init__(
        self,
        url: str,
        *,
        token_var: str | None = None,
        reset_timeout: float = RESET_TIMEOUT_S,
        tool_timeout: float = TOOL_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.url = ws_url(url)
        self.reset_timeout = float(reset_timeout)
        self.tool_timeout = float(tool_timeout)
        self.connect_timeout = float(connect_timeout)
        if min(self.reset_timeout, self.tool_timeout, self.connect_timeout) <= 0:
            raise ValueError(f"timeouts must be positive (reset {reset_timeout}, tool {tool_timeout}, "
                             f"connect {connect_timeout})")
        self._headers: dict[str, str] = {}
        if token_var:
            token = os.environ.get(token_var)
            if not token:
                raise EnvClientError(f"the environment variable {token_var} (the env server's token) is not set")
            self._headers["Authorization"] = f"Bearer {token}"
        self._ws: ClientConnection | None = None
        self._live = False
        self.task: dict[str, Any] | None = None
        self.tools: list[dict[str, Any]] = []

    async def __aenter__(self) -> EpisodeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- connection ----------------------------------------------------------------------------------

    async def _drop(self) -> None:
        ws, self._ws, self._live = self._ws, None, False
        if ws is not None:
            try:
                await asyncio.wait_for(ws.close(), 2)
            except Exception:  # already dead, or frozen (no closing handshake): let go of the socket now
                ws.transport.abort()

    async def _exchange(self, frame: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one frame and read its reply; any failure drops the connection."""
        ws = self._ws
        if ws is None:
            raise EnvConnectionError("not connected to the env server; call reset() first")
        try:
            try:
                await ws.send(strict_json.dumps(frame))
            except ConnectionClosed:
                pass  # a reply the server sent before closing (e.g. capacity) may still be queued
            raw = await asyncio.wait_for(ws.recv(), timeout)
        except TimeoutError as exc:
            await self._drop()
            raise EnvTimeoutError(f"no reply from {self.url} within {timeout:g}s") from exc
        except ConnectionClosed as exc:
            await self._drop()
            code = exc.rcvd.code if exc.rcvd is not None else None
            if code == 1008:
                raise EnvAuthError(f"{self.url} refused the bearer token (close 1008)") from exc
            raise EnvConnectionError(f"the env server closed the connection (code {code})") from exc
        try:
            # Strict: a reply holding NaN or Infinity is not JSON, and its numbers (a reward) cannot be trusted.
            reply = strict_json.loads(raw)
            data = reply["data"]
        except (ValueError, KeyError, TypeError) as exc:
            await self._drop()
            why = f" ({exc})" if isinstance(exc, ValueError) else ""
            raise EnvProtocolError(f"the env server sent a frame that is not strict JSON or lacks its data{why}: "
                                   f"{raw!r:.200}") from exc
        if reply.get("type") == "error":
            raise EnvProtocolError(f"{data.get('message')} ({data.get('code')})", data.get("code"), data)
        return data

    # -- episode -------------------------------------------------------------------------------------

    async def reset(self, split: str, index: int) -> tuple[str, str, list[dict[str, Any]]]:
        """Start task `index` of `split`: (prompt, system_prompt, tools as OpenAI function schemas).

        Waits for room on a full server and for a restarting one, up to `reset_timeout` in all; raises
        EnvUnreachableError once nothing has listened at the URL for `connect_timeout`.
        """
        self._live = False
        clock = Deadlines(self.url, self.reset_timeout, self.connect_timeout)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Retry),
            wait=clock.wait,
            stop=clock.stop,
            retry_error_callback=clock.give_up,
        )
        data = await retrying(self._try_reset, split, index, clock)
        meta = (data.get("observation") or {}).get("metadata") or data.get("metadata") or {}
        if data.get("done") or meta.get("status") == "error":
            raise EnvResetError(meta.get("error") or "the reset failed", meta)
        self.task = meta.get("task")
        self.tools = await self._list_tools()
        self._live = True
        return meta.get("prompt", ""), meta.get("system_prompt", ""), self.tools

    async def _try_reset(self, split: str, index: int, clock: Deadlines) -> dict[str, Any]:
        """One attempt: connect if needed and send the reset. `Retry` when it may work later."""
        started = time.monotonic()
        try:
            if self._ws is None:
                self._ws = await open_connection(self.url, self._headers, clock.remaining(), self.connect_timeout)
            frame = {"type": "reset", "data": {"split": split, "index": index}}
            try:
                data = await self._exchange(frame, clock.remaining())
            except EnvProtocolError as exc:
                if exc.code != "CAPACITY_REACHED":
                    raise
                await self._drop()
                raise Retry(exc, unreachable=False) from exc
            except (EnvTimeoutError, EnvAuthError):
                raise
            except EnvConnectionError as exc:  # the server went away: wait for it to come back
                raise Retry(exc, unreachable=False) from exc
        except Retry as exc:
            clock.note(exc.unreachable, started)
            raise
        return data

    async def _list_tools(self) -> list[dict[str, Any]]:
        data = await self._exchange({"type": "step", "data": {"type": "list_tools"}}, self.tool_timeout)
        return [openai_tool(t) for t in (data.get("observation") or {}).get("tools", [])]

    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> CallResult:
        """Call a tool of the current turn (or `end_turn`)."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise TypeError(f"tool arguments must be a dict, not {type(arguments).__name__}")
        try:
            strict_json.dumps(arguments)
        except ValueError as exc:  # checked here: sending would fail with the connection's state unclear
            raise ValueError(f"the arguments of {name!r} are not JSON: {exc}") from None
        if self._ws is None:
            raise EnvConnectionError("not connected to the env server (the connection was lost); call reset()")
        frame = {"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments}}
        data = await self._exchange(frame, self.tool_timeout + REPLY_GRACE_S)
        result = self._result(data)
        if result.done:
            self._live = False
        elif result.prompt is not None:  # end_turn opened another turn: its tools
            self.tools = result.tools = await self._list_tools()
        return result

    async def end_turn(self, text: str) -> CallResult:
        """End the agent's turn with `text`: the final score, or the next turn's prompt and tools."""
        return await self.call("end_turn", {"response": text})

    @staticmethod
    def _result(data: dict[str, Any]) -> CallResult:
        obs = data.get("observation") or {}
        meta = obs.get("metadata") or data.get("metadata") or {}
        result, error = obs.get("result"), obs.get("error")
        prompt = system_prompt = None
        text = ""
        if isinstance(result, dict) and "data" in result:
            text = str(result["data"])
        elif isinstance(result, dict) and "prompt" in result:
            prompt, system_prompt = result.get("prompt"), result.get("system_prompt")
            text = prompt or ""
        elif result is not None:
            text = result if isinstance(result, str) else json.dumps(result)
        if error and not text:
            text = str(error.get("message", ""))
        if not text and meta.get("status") == "error":
            text = str(meta.get("error", ""))
        reward = data.get("reward")
        return CallResult(
            text=text,
            is_error=bool(error) or meta.get("status") == "error",
            done=bool(data.get("done")),
            reward=None if reward is None else float(reward),
            scores=dict(meta.get("scores") or {}),
            metadata=meta,
            error_type=error.get("error_type") if error else None,
            failure=meta.get("failure"),
            prompt=prompt,
            system_prompt=system_prompt,
        )

    async def state(self) -> dict[str, Any]:
        """The server's view of this session: episode_id, step_count, task_id, split, index, turn, done."""
        return await self._exchange({"type": "state"}, self.tool_timeout)

    async def close(self) -> None:
        """End the session (the server tears the episode down). Safe to call twice."""
        ws = self._ws
        if ws is not None:
            try:
                await asyncio.wait_for(ws.send(json.dumps({"type": "close"})), 2)
            except Exception:  # the server is gone; nothing to tell it
                pass
        await self._drop()
