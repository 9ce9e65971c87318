"""`python -m agentrl.inference.serve model=tiny port=8300`: the session server on its own.

Builds (or finds) the model folder with `hydra.utils.instantiate(cfg.model)`, starts the engine
chosen by the `inference` group, and serves `build_session_app` with uvicorn until interrupted.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from agentrl.config import register_configs
from agentrl.config.locate import conf_dir

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="inference_serve")
def main(cfg: DictConfig) -> None:
    """Serve the session API for `cfg.model` with the `cfg.inference` engine on `cfg.host:cfg.port`."""
    import uvicorn

    from agentrl.inference.sessions import build_session_app

    model_path = hydra.utils.instantiate(cfg.model)
    engine = hydra.utils.instantiate(cfg.inference, model_path=model_path)
    try:
        app = build_session_app(engine, default_max_tokens=int(cfg.default_max_tokens))
        log.info("session server for %s on http://%s:%d", model_path, cfg.host, cfg.port)
        uvicorn.run(app, host=str(cfg.host), port=int(cfg.port), log_level=str(cfg.log_level))
    finally:
        engine.close()


def run() -> None:
    """Entry point: register the config schemas, then hand over to Hydra."""
    register_configs()
    main()


if __name__ == "__main__":
    run()
