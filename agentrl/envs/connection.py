"""Connecting to an env server: the client's errors, one connection attempt, and a reset's two clocks.

A reset keeps trying while the server is full or answers 503 (restarting) until `reset_timeout`, but only
for `connect_timeout` while nothing listens at all (refused, unknown host, no route, a 502 gateway) or the
process behind the port never answers the handshake (frozen); the TCP connect is made on its own so that
"nothing listens" is told apart from a slow handshake.
`EpisodeClient` (client.py) drives the attempts with tenacity.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from tenacity import RetryCallState, wait_exponential, wait_random
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.uri import parse_uri

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


class Retry(Exception):
    """An attempt to start an episode that may succeed later; `unreachable`: nothing listened."""

    def __init__(self, cause: BaseException, unreachable: bool) -> None:
        super().__init__(str(cause))
        self.cause, self.unreachable = cause, unreachable


class Deadlines:
    """The two clocks of one reset: `reset_timeout` in all, and `connect_timeout` while nothing listens."""

    def __init__(self, url: str, reset_timeout: float, connect_timeout: float) -> None:
        self.url, self.reset_timeout, self.connect_timeout = url, reset_timeout, connect_timeout
        self.deadline = time.monotonic() + reset_timeout
        self.unreachable_since: float | None = None

    def remaining(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def note(self, unreachable: bool, started: float | None = None) -> None:
        """Record an attempt's outcome: nothing listened (or answered) since `started`, or it answered."""
        if not unreachable:
            self.unreachable_since = None
        elif self.unreachable_since is None:  # from the attempt's start: a silent handshake took its time
            self.unreachable_since = time.monotonic() if started is None else started

    def _deadline(self, state: RetryCallState) -> float:
        """The deadline that applies after this outcome: connect_timeout's too while nothing listens."""
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Retry) and exc.unreachable and self.unreachable_since is not None:
            return min(self.deadline, self.unreachable_since + self.connect_timeout)
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
        assert isinstance(exc, Retry)
        url = self.url
        if exc.unreachable:
            waited = time.monotonic() - (self.unreachable_since or time.monotonic())
            raise EnvUnreachableError(
                f"the env server at {url} is unreachable: nothing answered for {waited:.1f}s "
                f"(connect_timeout {self.connect_timeout:g}s): {why_unreachable(exc.cause)}", url
            ) from exc.cause
        raise EnvConnectionError(f"no room for an episode on {url} (full, or restarting) within the reset_timeout "
                                 f"({self.reset_timeout:g}s): {exc.cause}") from exc.cause


def why_unreachable(exc: BaseException) -> str:
    """A connect failure in words."""
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused, nothing listens on that port ({exc})"
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc})"
    return f"{type(exc).__name__}: {exc}"


async def tcp_connect(host: str, port: int) -> socket.socket:
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


async def open_connection(
    url: str, headers: dict[str, str], timeout: float, connect_timeout: float
) -> ClientConnection:
    """One connection attempt to the env server at `url` (ws:// or wss://). Raises `Retry` for what may pass
    (unreachable when the TCP connect itself failed), EnvAuthError or EnvConnectionError for what will not."""
    try:
        uri = parse_uri(url)
    except InvalidURI as exc:
        raise EnvConnectionError(f"bad env server URL {url}: {exc}") from exc
    timeout = min(OPEN_TIMEOUT_S, timeout)
    tcp_timeout = min(timeout, connect_timeout)
    try:
        # The TCP connect on its own, so that "nothing listens" is told apart from a slow handshake.
        sock = await asyncio.wait_for(tcp_connect(uri.host, uri.port), tcp_timeout)
    except (OSError, TimeoutError) as exc:
        cause = exc if str(exc) else TimeoutError(f"no TCP connection within {tcp_timeout:g}s")
        raise Retry(cause, unreachable=True) from exc
    try:
        return await connect(
            url,
            sock=sock,
            additional_headers=headers or None,
            open_timeout=timeout,
            max_size=64 * 2**20,
            compression=None,
        )
    except InvalidStatus as exc:
        sock.close()
        status = exc.response.status_code
        if status in (401, 403):
            raise EnvAuthError(f"{url} refused the connection (HTTP {status})") from exc
        if status in _BUSY_STATUSES or status in _NO_UPSTREAM_STATUSES:
            raise Retry(exc, unreachable=status in _NO_UPSTREAM_STATUSES) from exc
        raise EnvConnectionError(f"{url} answered the WebSocket upgrade with HTTP {status}") from exc
    except TimeoutError as exc:
        sock.close()
        # The kernel took the TCP connection but the process never answered: it is frozen (SIGSTOP) or wedged,
        # not full (a full server answers the upgrade, then refuses the reset), so connect_timeout bounds it.
        silent = TimeoutError(f"the server took the TCP connection but did not answer the WebSocket handshake "
                              f"within {timeout:g}s (the process is frozen or wedged)")
        raise Retry(silent, unreachable=True) from exc
    except (OSError, InvalidHandshake, ConnectionClosed) as exc:
        sock.close()  # the server is there but the handshake failed: it may be starting or overloaded
        raise Retry(exc, unreachable=False) from exc
    except BaseException:
        sock.close()
        raise
