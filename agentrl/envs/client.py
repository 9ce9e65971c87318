"""`EpisodeClient`: the async client agents use to play one episode at a time on an env server.

It speaks the OpenEnv `/ws` protocol (any OpenEnv server that carries metadata in its observations
works). Connecting waits for room on a full server and rides out a restarting one until
`reset_timeout`; every failure is a typed `EnvClientError`, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

# Extra seconds the client waits beyond the server's own tool timeout before giving up on a reply.
REPLY_GRACE_S = 15.0


class EnvClientError(Exception):
    """Anything that went wrong talking to the env server."""


class EnvConnectionError(EnvClientError):
    """No server to talk to: refused, unreachable past the deadline, or the connection dropped."""


class EnvAuthError(EnvConnectionError):
    """The server refused the bearer token (HTTP 401/403 or WebSocket close 1008)."""


class EnvTimeoutError(EnvClientError):
    """The server did not answer in time; the connection is dropped (its replies would be out of step)."""


class EnvProtocolError(EnvClientError):
    """The server answered with a protocol error frame (bad message, unknown type, ...)."""

    def __init__(self, message: str, code: str | None = None, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data or {}


class EnvResetError(EnvClientError):
    """The reset was refused (unknown split, index out of range) or the deploy failed."""

    def __init__(self, message: str, metadata: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.metadata = metadata or {}


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


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": tool.get("description") or "", "parameters": schema},
    }


class EpisodeClient:
    """One connection to an env server, playing one episode after another.

    `async with EpisodeClient(url) as env: prompt, system, tools = await env.reset("eval", 3)`.
    """

    def __init__(
        self,
        url: str,
        *,
        token_var: str | None = None,
        reset_timeout: float = 600,
        tool_timeout: float = 60,
        connect_timeout: float = 10,
    ) -> None:
        self.url = ws_url(url)
        self.reset_timeout = float(reset_timeout)
        self.tool_timeout = float(tool_timeout)
        self.connect_timeout = float(connect_timeout)
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

    async def _connect(self, deadline: float) -> ClientConnection:
        """Connect, retrying refused connections until `deadline`."""
        delay = 0.05
        while True:
            try:
                return await connect(
                    self.url,
                    additional_headers=self._headers or None,
                    open_timeout=max(0.1, min(self.connect_timeout, deadline - time.monotonic())),
                    max_size=64 * 2**20,
                    compression=None,
                    proxy=None,
                )
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403):
                    raise EnvAuthError(f"{self.url} refused the connection (HTTP {status})") from exc
                err: Exception = exc
            except InvalidURI as exc:
                raise EnvConnectionError(f"bad env server URL {self.url}: {exc}") from exc
            except (OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as exc:
                err = exc
            if time.monotonic() + delay > deadline:
                raise EnvConnectionError(f"could not connect to {self.url}: {err!r}") from err
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _drop(self) -> None:
        ws, self._ws, self._live = self._ws, None, False
        if ws is not None:
            try:
                await asyncio.wait_for(ws.close(), 2)
            except Exception:  # already dead
                pass

    async def _exchange(self, frame: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one frame and read its reply; any failure drops the connection."""
        ws = self._ws
        if ws is None:
            raise EnvConnectionError("not connected to the env server; call reset() first")
        try:
            try:
                await ws.send(json.dumps(frame))
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
            reply = json.loads(raw)
            data = reply["data"]
        except (ValueError, KeyError, TypeError) as exc:
            await self._drop()
            raise EnvProtocolError(f"the env server sent a malformed frame: {raw!r:.200}") from exc
        if reply.get("type") == "error":
            raise EnvProtocolError(f"{data.get('message')} ({data.get('code')})", data.get("code"), data)
        return data

    # -- episode -------------------------------------------------------------------------------------

    async def reset(self, split: str, index: int) -> tuple[str, str, list[dict[str, Any]]]:
        """Start task `index` of `split`: (prompt, system_prompt, tools as OpenAI function schemas).

        Waits for room on a full server and for a restarting one, up to `reset_timeout` in all.
        """
        deadline = time.monotonic() + self.reset_timeout
        self._live = False
        delay = 0.05
        while True:
            if self._ws is None:
                self._ws = await self._connect(deadline)
            remaining = deadline - time.monotonic()
            try:
                data = await self._exchange({"type": "reset", "data": {"split": split, "index": index}}, remaining)
            except EnvProtocolError as exc:
                if exc.code != "CAPACITY_REACHED":
                    raise
                await self._drop()
                retry: Exception = exc
            except EnvTimeoutError:
                raise
            except EnvAuthError:
                raise
            except EnvConnectionError as exc:  # the server went away: wait for it to come back
                retry = exc
            else:
                break
            if time.monotonic() + delay > deadline:
                raise EnvConnectionError(f"no room for an episode on {self.url} before the deadline: {retry}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        meta = (data.get("observation") or {}).get("metadata") or data.get("metadata") or {}
        if data.get("done") or meta.get("status") == "error":
            raise EnvResetError(meta.get("error") or "the reset failed", meta)
        self.task = meta.get("task")
        self.tools = await self._list_tools()
        self._live = True
        return meta.get("prompt", ""), meta.get("system_prompt", ""), self.tools

    async def _list_tools(self) -> list[dict[str, Any]]:
        data = await self._exchange({"type": "step", "data": {"type": "list_tools"}}, self.tool_timeout)
        return [_openai_tool(t) for t in (data.get("observation") or {}).get("tools", [])]

    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> CallResult:
        """Call a tool of the current turn (or `end_turn`)."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise TypeError(f"tool arguments must be a dict, not {type(arguments).__name__}")
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
