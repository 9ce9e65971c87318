"""A blocking client for someone else's OpenEnv server: `/health`, `/schema` and one `/ws` session.

Episode methods run on the local sandbox's worker threads, so this client is synchronous (websockets'
sync API): one `RemoteSession` per episode. A server at capacity (OpenEnv's default cap is one
session) is waited for until `room_timeout`; every other failure is a `RemoteEnvError` naming the URL.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

# A frame of up to 64 MiB: observations can carry boards, images as text, long documents.
MAX_FRAME = 64 << 20


class RemoteEnvError(RuntimeError):
    """The remote OpenEnv server failed, refused, or answered something that is not the protocol."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def base_url(url: str) -> str:
    """`http(s)://host:port[/prefix]` without a trailing `/` or `/ws`; a bare `host:port` gets http://."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(f"env.url must be an http(s) URL of an OpenEnv server, not {url!r}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/ws") else path
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def auth_headers(token_var: str | None) -> dict[str, str]:
    """`Authorization: Bearer <token>` from the environment variable `token_var` names (env.token_var)."""
    if not token_var:
        return {}
    token = os.environ.get(token_var)
    if not token:
        raise ValueError(f"env.token_var={token_var} but that environment variable is unset or empty")
    return {"Authorization": f"Bearer {token}"}


def probe(url: str, headers: dict[str, str], timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`/schema`, `/metadata`) of the server at `url`; RemoteEnvError naming env.url when nothing answers."""
    try:
        with httpx.Client(timeout=timeout, trust_env=False, headers=headers) as http:
            health = http.get(f"{url}/health")
            if health.status_code != 200:
                raise RemoteEnvError(f"env.url={url}: /health answered HTTP {health.status_code}, "
                                     "not an OpenEnv server that is up")
            schema = http.get(f"{url}/schema")
            meta = http.get(f"{url}/metadata")
    except httpx.HTTPError as exc:
        raise RemoteEnvError(f"env.url={url} is unreachable: {type(exc).__name__}: {exc}") from exc
    return (_json_or_empty(schema), _json_or_empty(meta))


def _json_or_empty(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json() if response.status_code == 200 else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def capacity_message(url: str, waited: float, refusal: RemoteEnvError) -> str:
    """Why a session found no room, and what to change: every slot of the server is held by someone."""
    said = str(refusal).removeprefix(f"env.url={url}: ")
    return (f"env.url={url} stayed at capacity for {waited:g}s (env.room_timeout; the server said: {said}). "
            "Every session it allows is held, most likely by sessions nobody closed (a client that opens "
            "sessions without closing them, or a killed run's sessions the server has not reaped yet: restart "
            "the server or wait for its idle timeout), or by more episodes at once than its "
            "max_concurrent_envs: this run plays up to env.server.max_concurrent_envs episodes at once, each "
            "one remote session, so set that to at most the server's max_concurrent_envs (or raise the "
            "server's), and count any other client of the same server")


class RemoteSession:
    """One WebSocket session (one env instance) on the remote server, opened by its first reset."""

    def __init__(self, url: str, headers: dict[str, str], *, timeout: float, room_timeout: float) -> None:
        self.url = url
        self.timeout = float(timeout)
        self._headers = headers
        self._room_timeout = float(room_timeout)
        self._ws: ClientConnection | None = None

    def _connect(self) -> ClientConnection:
        ws_url = "ws" + self.url[len("http"):] + "/ws"
        try:
            return connect(ws_url, additional_headers=self._headers, open_timeout=self.timeout,
                           max_size=MAX_FRAME, proxy=None, legacy=True)
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise RemoteEnvError(f"env.url={self.url}: cannot open {ws_url}: {type(exc).__name__}: {exc}",
                                 "CONNECTION") from exc

    def reset(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Open the session and reset it; a full server (OpenEnv's default cap is one session) is waited
        for until `room_timeout`."""
        deadline = time.monotonic() + self._room_timeout
        delay = 0.05
        while True:
            if self._ws is None:
                self._ws = self._connect()
            try:
                return self.exchange({"type": "reset", "data": kwargs})
            except RemoteEnvError as exc:
                if exc.code != "CAPACITY_REACHED":
                    raise
                self.close()
                if time.monotonic() + delay > deadline:
                    raise RemoteEnvError(capacity_message(self.url, self._room_timeout, exc), exc.code) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def exchange(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send one frame and return its reply's `data`; an error frame raises RemoteEnvError with its code."""
        ws = self._ws
        if ws is None:
            raise RemoteEnvError(f"env.url={self.url}: the session is closed", "CONNECTION")
        try:
            try:
                ws.send(json.dumps(frame))
            except ConnectionClosed:
                pass  # a frame the server sent before closing (capacity) may still be queued
            raw = ws.recv(timeout=self.timeout)
        except TimeoutError as exc:
            self.close()
            raise RemoteEnvError(f"env.url={self.url}: no reply within {self.timeout:g}s (env.step_timeout)",
                                 "TIMEOUT") from exc
        except (ConnectionClosed, OSError) as exc:
            self.close()
            raise RemoteEnvError(f"env.url={self.url}: the connection was lost: {exc}", "CONNECTION") from exc
        try:
            reply = json.loads(raw)
            data = reply["data"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RemoteEnvError(f"env.url={self.url} sent a malformed frame: {raw!r:.200}", "PROTOCOL") from exc
        if reply.get("type") == "error":
            raise RemoteEnvError(f"env.url={self.url}: {data.get('message')} ({data.get('code')})", data.get("code"))
        return data

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return self.exchange({"type": "step", "data": action})

    def list_tools(self) -> list[dict[str, Any]]:
        """The MCP tools of this session's env ([] when it has none or does not take list_tools)."""
        try:
            data = self.step({"type": "list_tools"})
        except RemoteEnvError as exc:
            if exc.code in ("VALIDATION_ERROR", "EXECUTION_ERROR"):
                return []  # a typed-action env: list_tools is not one of its actions
            raise
        tools = (data.get("observation") or {}).get("tools")
        return [t for t in tools if isinstance(t, dict) and t.get("name")] if isinstance(tools, list) else []

    def close(self) -> None:
        """End the session (the server tears its env down). Safe to call twice."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        # Say `close` and let the server close the socket: closing ours at once races OpenEnv's own
        # close (it then logs a ClientDisconnected traceback).
        try:
            ws.send(json.dumps({"type": "close"}))
            ws.recv(timeout=2.0)
        except Exception:  # noqa: BLE001 - closed by the server (the normal end), or already gone
            pass
        ws.close()
