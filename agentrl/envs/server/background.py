"""Run an ASGI app on uvicorn in a background thread (the trainer serves its env in-process this way)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn


def start_server_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    log_level: str = "warning",
    startup_timeout: float = 30.0,
) -> tuple[str, Callable[[], None]]:
    """Serve `app` on uvicorn in a daemon thread; returns (base URL, stop function).

    `port=0` picks a free port. The stop function asks uvicorn to shut down (which runs the app's
    shutdown, tearing every live episode down) and waits for the thread; calling it twice is harmless.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, host=host, port=bound_port, log_level=log_level, timeout_graceful_shutdown=10, ws_ping_interval=20
    )
    server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the starter below
            errors.append(exc)
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"uvicorn-{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if errors or not thread.is_alive():
            raise RuntimeError(f"the server did not start: {errors[0] if errors else 'it exited'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the server did not start within {startup_timeout}s")
        time.sleep(0.01)

    def stop(timeout: float = 30.0) -> None:
        server.should_exit = True
        thread.join(timeout)

    url_host = f"[{host}]" if ":" in host else host
    return f"http://{url_host}:{bound_port}", stop


@contextlib.contextmanager
def serve_in_background(app: Any, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> Iterator[str]:
    """`with serve_in_background(app) as url:` serves `app` for the block's duration."""
    url, stop = start_server_in_thread(app, host, port, **kwargs)
    try:
        yield url
    finally:
        stop()
