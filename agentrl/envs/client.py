"""`EpisodeClient`: the async client agents use to play one episode at a time on an env server.

It speaks the OpenEnv `/ws` protocol (any OpenEnv server that carries metadata in its observations
works). A reset waits for room on a full server, and for one that answers 503 while it restarts, until
`reset_timeout`; but when nothing listens at the URL at all (connection refused, unknown host, no
route) it gives up after `connect_timeout` with `EnvUnreachableError`. Every failure is a typed
`EnvClientError`, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential, wait_random
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.uri import parse_uri

# Extra seconds the client waits beyond the server's own tool timeout before giving up on a reply.
REPLY_GRACE_S = 15.0
# The longest one connection attempt (TCP connect, then the WebSocket handshake) may take.
OPEN_TIMEOUT_S = 10.0
# Statuses a server or proxy answers the upgrade with while it is (re)starting or busy: wait for it.
_BUSY_STATUSES = frozenset({429, 503, 504})
# A gateway that reaches nothing behind it: as good as nothing listening.
_NO_UPSTREAM_STATUSES = frozenset({502})
_BACKOFF = wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05)


class EnvClientError(Exception):
    """Anything that went wrong talking to the env server."""


class EnvConnectionError(EnvClientError):
    """No server to talk to: refused, unreachable past the deadline, or the connection dropped."""


class EnvUnreachableError(EnvConnectionError):
    """Nothing listened at the env server's URL (refused, unknown host, no route) for `connect_timeout`."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


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


def openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool (`input_schema` or `inputSchema`) as an OpenAI function schema."""
    schema = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": tool.get("description") or "", "parameters": schema},
    }


class _Retry(Exception):
    """An attempt to start an episode that may succeed later; `unreachable`: nothing listened."""

    def __init__(self, cause: BaseException, unreachable: bool) -> None:
        super().__init__(str(cause))
        self.cause, self.unreachable = cause, unreachable


class _Deadlines:
    """The two clocks of one reset: `reset_timeout` in all, and `connect_timeout` while nothing listens."""

    def __init__(self, client: EpisodeClient) -> None:
        self.client = client
        self.deadline = time.monotonic() + client.reset_timeout
        self.unreachable_since: float | None = None

    def remaining(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def note(self, unreachable: bool) -> None:
        """Record an attempt's outcome: nothing listened, or the server answered something."""
        if not unreachable:
            self.unreachable_since = None
        elif self.unreachable_since is None:
            self.unreachable_since = time.monotonic()

    def _deadline(self, state: RetryCallState) -> float:
        """The deadline that applies after this outcome: connect_timeout's too while nothing listens."""
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Retry) and exc.unreachable and self.unreachable_since is not None:
            return min(self.deadline, self.unreachable_since + self.client.connect_timeout)
        return self.deadline

    def wait(self, state: RetryCallState) -> float:
        """Back off (jittered, so many rollouts waiting on one server do not knock in step), never past the
        deadline, so that the last attempt comes at it."""
        return max(0.0, min(_BACKOFF(state), self._deadline(state) - time.monotonic()))

    def stop(self, state: RetryCallState) -> bool:
        return time.monotonic() >= self._deadline(state)

    def give_up(self, state: RetryCallState) -> Any:
        """Raise the public error for the last failed attempt."""
        exc = state.outcome.exception() if state.outcome else None
        assert isinstance(exc, _Retry)
        url = self.client.url
        if exc.unreachable:
            waited = time.monotonic() - (self.unreachable_since or time.monotonic())
            raise EnvUnreachableError(
                f"the env server at {url} is unreachable: nothing answered for {waited:.1f}s "
                f"(connect_timeout {self.client.connect_timeout:g}s): {_why_unreachable(exc.cause)}", url
            ) from exc.cause
        raise EnvConnectionError(f"no room for an episode on {url} (full, or restarting) within the reset_timeout "
                                 f"({self.client.reset_timeout:g}s): {exc.cause}") from exc.cause


def _why_unreachable(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused, nothing listens on that port ({exc})"
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc})"
    return f"{type(exc).__name__}: {exc}"


async def _tcp_connect(host: str, port: int) -> socket.socket:
    """A connected TCP socket to `host:port`; OSError when nothing listens there (refused, unknown, no route)."""
    loop = asyncio.get_running_loop()
    error: OSError | None = None
    for family, kind, proto, _, address in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"no address for {host}")


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
        reset_timeout: float = 600,
        tool_timeout: float = 60,
        connect_timeout: float = 30,
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

    async def _open(self, timeout: float) -> ClientConnection:
        """One connection attempt. Raises `_Retry` for what may pass (unreachable when the TCP connect
        itself failed), EnvAuthError or EnvConnectionError for what will not."""
        try:
            uri = parse_uri(self.url)
        except InvalidURI as exc:
            raise EnvConnectionError(f"bad env server URL {self.url}: {exc}") from exc
        timeout = min(OPEN_TIMEOUT_S, timeout)
        tcp_timeout = min(timeout, self.connect_timeout)
        try:
            # The TCP connect on its own, so that "nothing listens" is told apart from a slow handshake.
            sock = await asyncio.wait_for(_tcp_connect(uri.host, uri.port), tcp_timeout)
        except (OSError, TimeoutError) as exc:
            cause = exc if str(exc) else TimeoutError(f"no TCP connection within {tcp_timeout:g}s")
            raise _Retry(cause, unreachable=True) from exc
        try:
            return await connect(
                self.url,
                sock=sock,
                additional_headers=self._headers or None,
                open_timeout=timeout,
                max_size=64 * 2**20,
                compression=None,
            )
        except InvalidStatus as exc:
            sock.close()
            status = exc.response.status_code
            if status in (401, 403):
                raise EnvAuthError(f"{self.url} refused the connection (HTTP {status})") from exc
            if status in _BUSY_STATUSES or status in _NO_UPSTREAM_STATUSES:
                raise _Retry(exc, unreachable=status in _NO_UPSTREAM_STATUSES) from exc
            raise EnvConnectionError(f"{self.url} answered the WebSocket upgrade with HTTP {status}") from exc
        except (OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as exc:
            sock.close()  # the server is there but the handshake failed: it may be starting or overloaded
            raise _Retry(exc, unreachable=False) from exc
        except BaseException:
            sock.close()
            raise

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

        Waits for room on a full server and for a restarting one, up to `reset_timeout` in all; raises
        EnvUnreachableError once nothing has listened at the URL for `connect_timeout`.
        """
        self._live = False
        clock = _Deadlines(self)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Retry),
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

    async def _try_reset(self, split: str, index: int, clock: _Deadlines) -> dict[str, Any]:
        """One attempt: connect if needed and send the reset. `_Retry` when it may work later."""
        try:
            if self._ws is None:
                self._ws = await self._open(clock.remaining())
            frame = {"type": "reset", "data": {"split": split, "index": index}}
            try:
                data = await self._exchange(frame, clock.remaining())
            except EnvProtocolError as exc:
                if exc.code != "CAPACITY_REACHED":
                    raise
                await self._drop()
                raise _Retry(exc, unreachable=False) from exc
            except (EnvTimeoutError, EnvAuthError):
                raise
            except EnvConnectionError as exc:  # the server went away: wait for it to come back
                raise _Retry(exc, unreachable=False) from exc
        except _Retry as exc:
            clock.note(exc.unreachable)
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
