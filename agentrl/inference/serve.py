"""`python -m agentrl.inference.serve model=tiny port=8300`: the session server on its own.

Builds (or finds) the model folder with `hydra.utils.instantiate(cfg.model)`, starts the engine
chosen by the `inference` group, and serves `build_session_app` with uvicorn until interrupted.

Lifecycle, for a supervisor (systemd, Kubernetes, Ray) to rely on:
* SIGTERM / SIGINT end the process within `SHUTDOWN_DEADLINE_S` seconds even when the engine is
  wedged: requests get `SHUTDOWN_DEADLINE_S - 2` s to finish (turns still running a second before
  that answer 503 `{"error": ...}`), then a watchdog exits regardless.
* An engine whose worker dies fails every pending request with 503 naming the cause (`/health`
  turns 503 too), and the process exits with `EXIT_ENGINE_DIED`. It does not restart the engine
  in-process: what kills a worker (a CUDA fault, out of memory, weights that turned NaN) usually
  survives a restart in the same process, and reloading from disk would silently roll back the
  weights a trainer pushed (`weight_version` back to 0). A fresh process from the supervisor is
  the honest restart.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import hydra
from omegaconf import DictConfig

from agentrl.config import register_configs
from agentrl.config.locate import conf_dir

log = logging.getLogger(__name__)

SHUTDOWN_DEADLINE_S = 5.0
EXIT_ENGINE_DIED = 70  # EX_SOFTWARE (sysexits.h): restart me


def exit_when_engine_dies(engine: Any, server: Any) -> None:
    """Shut `server` (a `DeadlineServer`) down with `EXIT_ENGINE_DIED` once `engine`'s worker stops unasked."""
    stopped = getattr(engine, "stopped", None)  # EmbeddedEngine's; other engines fail per request instead
    if stopped is None:
        return

    def watch() -> None:
        stopped.wait()
        if not server.should_exit:  # not our own shutdown closing the engine
            from agentrl.inference.sessions.app import engine_failure

            cause = engine_failure(engine) or "the engine stopped"
            log.error("%s; exiting with %d so the supervisor starts a fresh server", cause, EXIT_ENGINE_DIED)
            server.shutdown_soon(cause, EXIT_ENGINE_DIED)

    threading.Thread(target=watch, name="engine-watch", daemon=True).start()


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="inference_serve")
def main(cfg: DictConfig) -> None:
    """Serve the session API for `cfg.model` with the `cfg.inference` engine on `cfg.host:cfg.port`."""
    import uvicorn

    from agentrl.inference.sessions.app import build_session_app
    from agentrl.uvicorn_servers import DeadlineServer

    model_path = hydra.utils.instantiate(cfg.model)
    engine = hydra.utils.instantiate(cfg.inference, model_path=model_path)
    try:
        app = build_session_app(engine, default_max_tokens=int(cfg.default_max_tokens),
                                tool_format=str(cfg.model.tool_format),
                                max_body_bytes=int(cfg.inference.max_body_bytes))
        config = uvicorn.Config(app, host=str(cfg.host), port=int(cfg.port), log_level=str(cfg.log_level),
                                timeout_graceful_shutdown=max(1, int(SHUTDOWN_DEADLINE_S) - 2))
        # turns still running near the grace's end answer 503 JSON before uvicorn would cancel them
        server = DeadlineServer(config, deadline=SHUTDOWN_DEADLINE_S, on_shutdown=app.state.drain.begin)
        exit_when_engine_dies(engine, server)
        log.info("session server for %s on http://%s:%d", model_path, cfg.host, cfg.port)
        server.run()  # after a signal, uvicorn re-raises it here once shut down
    finally:
        engine.close(timeout=1.0)  # a wedged worker is a daemon thread: it does not hold the exit
    if server.exit_code:
        raise SystemExit(server.exit_code)  # hydra reports only Exception; this reaches the interpreter


def run() -> None:
    """Entry point: register the config schemas, then hand over to Hydra."""
    register_configs()
    main()


if __name__ == "__main__":
    run()
