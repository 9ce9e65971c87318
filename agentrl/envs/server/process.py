"""The run's env server in a child process of its own (`env.server.process=true`).

Why. By default the trainer serves its env on a thread of its own process, so the env server's HTTP, WebSocket
frames and tool calls share the learner's interpreter (its GIL) and core. A py-spy sample of an asynchronous run
(`trainer.max_staleness=4`, the engine in its own process) found the env server's uvicorn thread in 20% of the
samples where another thread held the learner's GIL. In a child it runs on its own interpreter. On GridSim, whose
episodes are one tool call, that bought no measurable speed (benchmarks/RESULTS.md); it is for envs whose tool
calls are heavy Python, hence off by default.

How. The child rebuilds the bundle from `Bundle.spec()` (as a Docker sandbox does), builds the same app the
thread would serve, and serves it on its port; the parent waits for its URL. The child dies with the run: it stops
its server (tearing its episodes down) when the parent says close or its pipe closes, and the kernel kills it
when the parent dies (PR_SET_PDEATHSIG). It ignores Ctrl-C, so that the parent's teardown, not the signal, ends
its episodes. A child that dies refuses connections, which the trainer's dependency watch names as the env server.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
from typing import Any

from agentrl.child_process import die_with_parent
from agentrl.envs.sandbox.container_agent import DEFAULT_LOADER, resolve_loader

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # loading a bundle's data in the child (a loaded box, a large bundle)


class EnvServerError(RuntimeError):
    """The env server process could not start (its bundle, its port); the message says why."""


class EnvServerProcess:
    """`build_app(load_bundle(**bundle_spec), **app_options)` served from a child process at `base_url`; `loader`
    ('module:function' or '/abs/file.py:function', as a Docker sandbox takes it) replaces `load_bundle`."""

    def __init__(self, bundle_spec: dict[str, Any], *, host: str = "127.0.0.1", port: int = 0,
                 app_options: dict[str, Any] | None = None, loader: str = DEFAULT_LOADER,
                 ready_timeout: float = READY_TIMEOUT_S) -> None:
        ctx = mp.get_context("spawn")  # no fork: the parent's threads and torch state stay out of the child
        self._conn, child_end = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, name="agentrl-env-server", daemon=True,
                                 args=(child_end, dict(bundle_spec), loader, host, int(port), dict(app_options or {})))
        self._proc.start()
        child_end.close()
        name = bundle_spec.get("bundle")
        try:
            if not self._conn.poll(ready_timeout):
                raise EnvServerError(f"the env server process did not start serving {name} in {ready_timeout:.0f} s")
            kind, info = self._conn.recv()
        except EOFError:
            self._proc.join(5)
            raise EnvServerError(f"the env server process died while starting {name} "
                                 f"(exit code {self._proc.exitcode})") from None
        except BaseException:
            self._kill()
            raise
        if kind == "error":
            self._proc.join(5)
            raise EnvServerError(f"the env server process could not serve {name}: {info}")
        self.base_url: str = info
        self.pid: int = self._proc.pid
        log.info("env server process %d serves %s at %s", self.pid, name, self.base_url)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the child's server (its episodes torn down) and wait for the child to exit; kill it past `timeout`."""
        try:
            self._conn.send("close")
        except (OSError, BrokenPipeError):
            pass  # already gone
        self._proc.join(timeout)
        if self._proc.is_alive():
            log.warning("the env server process %d did not stop in %.0f s; killing it", self._proc.pid, timeout)
        self._kill()
        self._conn.close()

    def _kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    def __enter__(self) -> EnvServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _child_main(conn: Any, bundle_spec: dict[str, Any], loader: str, host: str, port: int,
                app_options: dict[str, Any]) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent's teardown ends us
    try:
        from agentrl.envs.server import build_app, start_server_in_thread

        app = build_app(resolve_loader(loader)(**bundle_spec), **app_options)
        url, stop = start_server_in_thread(app, host, port)
    except Exception as exc:  # noqa: BLE001 - the parent raises it, named; as text: not every exception pickles
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", url))
    try:
        conn.recv()  # "close", or EOF: the parent is gone
    except (EOFError, OSError):
        pass
    finally:
        stop()
