"""uvicorn helpers shared by the env server and the inference session server.

* `ThreadedServer` / `start_server_in_thread` / `serve_in_background`: serve an ASGI app on a
  daemon thread with its own event loop (trainers and tests run servers in-process this way).
* `DeadlineServer`: a foreground uvicorn server whose shutdown cannot outlast a deadline, so a
  wedged handler (an engine stuck in a forward pass) never keeps SIGTERM from ending the process.
* Both take `on_shutdown(grace_s)`, called as shutdown begins (`HookedServer`), so an app can answer
  its open requests itself before uvicorn's grace period ends.
* `read_body`: a request body under a size limit, the rest drained (to a bound) before the 413, so that
  clients which send their whole body before reading see the answer (the session server's `BodyLimit`, `/mcp`).

Neutral on purpose: `agentrl.envs` and `agentrl.inference` both import it, never each other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


class ThreadedServer:
    """uvicorn serving `app` on a daemon thread; `config` goes to `uvicorn.Config` (log_level, lifespan, ...)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 on_shutdown: Callable[[float | None], None] | None = None, **config: Any) -> None:
        self.app = app
        self.host = host
        self.port = int(port)
        self._config = {"log_level": "warning", **config}
        self._on_shutdown = on_shutdown
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        """Bind, start serving and return once uvicorn accepts connections; `port=0` picks a free port."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse the port at once
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        server = HookedServer(uvicorn.Config(self.app, host=self.host, port=self.port, **self._config),
                              on_shutdown=self._on_shutdown)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                server.run(sockets=[sock])
            except BaseException as exc:  # noqa: BLE001 - reported to the starter below
                errors.append(exc)
            finally:
                sock.close()

        self._server = server
        self._thread = threading.Thread(target=run, name=f"uvicorn-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if errors or not self._thread.is_alive():
                raise RuntimeError(f"the server on {self.url} did not start: {errors[0] if errors else 'it exited'}")
            if time.monotonic() > deadline:
                server.should_exit = True
                raise TimeoutError(f"the server on {self.url} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to shut down (running the app's shutdown) and wait up to `timeout`; idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def start_server_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    log_level: str = "warning",
    startup_timeout: float = 30.0,
) -> tuple[str, Callable[..., None]]:
    """Serve `app` on uvicorn in a daemon thread; returns (base URL, stop function).

    `port=0` picks a free port. The stop function asks uvicorn to shut down (which runs the app's
    shutdown, tearing every live episode down) and waits for the thread; calling it twice is harmless.
    """
    server = ThreadedServer(app, host, port, log_level=log_level, timeout_graceful_shutdown=10,
                            ws_ping_interval=20).start(startup_timeout)
    return server.url, server.stop


@contextlib.contextmanager
def serve_in_background(app: Any, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> Iterator[str]:
    """`with serve_in_background(app) as url:` serves `app` for the block's duration."""
    url, stop = start_server_in_thread(app, host, port, **kwargs)
    try:
        yield url
    finally:
        stop()


class HookedServer(uvicorn.Server):
    """uvicorn's server, calling `on_shutdown(grace_s)` on its event loop as shutdown begins.

    `grace_s` is `timeout_graceful_shutdown` (None: no limit), after which uvicorn cancels the requests
    still open and answers them with a 500 in plain text; the hook lets the app answer them first.
    """

    def __init__(self, config: uvicorn.Config, *, on_shutdown: Callable[[float | None], None] | None = None) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_shutdown is not None:
            grace = self.config.timeout_graceful_shutdown
            try:
                self.on_shutdown(None if grace is None else float(grace))
            except Exception:  # a failing hook must not stop the shutdown
                log.exception("the on_shutdown hook failed")
        await super().shutdown(sockets)


class DeadlineServer(HookedServer):
    """A uvicorn server that exits the process `deadline` seconds after shutdown begins, whatever runs.

    uvicorn's graceful shutdown waits for every open request, and the code after it (closing an
    engine) may wait on a thread that never returns; the watchdog's `os._exit` is what guarantees
    that SIGTERM, SIGINT or `shutdown()` ends the process. Set `config.timeout_graceful_shutdown`
    below `deadline` so a clean shutdown normally finishes first.
    """

    def __init__(self, config: uvicorn.Config, *, deadline: float = 5.0,
                 on_shutdown: Callable[[float | None], None] | None = None) -> None:
        super().__init__(config, on_shutdown=on_shutdown)
        self.deadline = float(deadline)
        self.exit_code = 0
        self._watchdog: threading.Thread | None = None
        self._watch_lock = threading.Lock()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's signal handler, plus the deadline."""
        self._arm(f"signal {sig}", 128 + int(sig))
        super().handle_exit(sig, frame)

    def shutdown_soon(self, reason: str, exit_code: int) -> None:
        """Stop serving (from any thread) and exit with `exit_code`, forcibly once the deadline passes."""
        self.exit_code = exit_code
        self._arm(reason, exit_code)
        self.should_exit = True

    def _arm(self, reason: str, code: int) -> None:
        with self._watch_lock:
            if self._watchdog is not None:
                return
            log.info("shutting down (%s); the process exits within %.0fs", reason, self.deadline)
            self._watchdog = threading.Thread(target=self._expire, args=(reason, code), name="shutdown-deadline",
                                              daemon=True)
            self._watchdog.start()

    def _expire(self, reason: str, code: int) -> None:
        time.sleep(self.deadline)
        log.error("shutdown (%s) passed its %.0fs deadline with work still running; exiting now", reason,
                  self.deadline)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code or 1)


# Past a body limit, how much more of the body is read and dropped before the 413 goes out: a client such as
# Python's http.client sends its whole body before reading, and a server that closes on unread bytes makes the
# kernel reset the connection, losing the 413 the client never read. Beyond this, closing is cheaper.
DRAIN_BYTES = 16 << 20


class BodyTooLarge(Exception):
    """A request body over the limit (HTTP 413); `declared` is its Content-Length when it gave one."""

    def __init__(self, declared: int | None) -> None:
        super().__init__(declared)
        self.declared = declared


class ClientGone(Exception):
    """The client disconnected before its request body ended."""


async def read_body(receive: Callable[[], Any], headers: Any, max_bytes: int) -> bytes:
    """An HTTP request's body from ASGI `receive`, at most `max_bytes` of it kept.

    A larger body raises BodyTooLarge once up to `DRAIN_BYTES` more were read and dropped (so the client has sent
    it all and reads the answer), or at once when its Content-Length already says it is larger than that. Answer
    it with `Connection: close`. ClientGone when the client disconnects first.
    """
    declared_text = dict(headers or ()).get(b"content-length", b"")
    declared = int(declared_text) if declared_text.isdigit() else None
    if declared is not None and declared > max_bytes + DRAIN_BYTES:
        raise BodyTooLarge(declared)
    chunks: list[bytes] = []
    size = 0
    over = declared is not None and declared > max_bytes
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        over = over or size > max_bytes
        if not over:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
        if size > max_bytes + DRAIN_BYTES:
            break
    if over:
        raise BodyTooLarge(declared)
    return b"".join(chunks)
