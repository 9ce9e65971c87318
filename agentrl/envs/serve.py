"""`python -m agentrl.envs.serve env=gridsim port=8200`: serve a bundle over the OpenEnv protocol.

Configured by Hydra from `conf/serve.yaml` (its schema `agentrl.config.serve.ServeConfig`; the `env` and `sandbox`
groups of the project's config).
With `token_var=NAME` the bearer token is read from that environment variable, never the command line.
SIGTERM (or Ctrl-C) tears every live episode down before the process exits.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from agentrl.config import register_configs
from agentrl.config.locate import conf_dir

log = logging.getLogger("agentrl.envs.serve")


def read_token(token_var: str | None) -> str | None:
    """The bearer token from the environment variable named `token_var` (None when no name is given)."""
    if not token_var:
        return None
    token = os.environ.get(token_var)
    if not token:
        raise SystemExit(f"agentrl.envs.serve: token_var={token_var} but that environment variable is unset or empty")
    return token


def run_server(app: Any, host: str, port: int, *, log_level: str = "info") -> None:
    """Run `app` on uvicorn in the foreground until SIGINT/SIGTERM; live episodes are torn down on the way out."""
    import uvicorn

    # A bounded graceful shutdown: open WebSockets are closed, then the app's shutdown tears episodes down.
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=15)


def serve(cfg: DictConfig) -> None:
    """Build the bundle, the sandbox and the app from a composed serve config, and run it."""
    from hydra.utils import instantiate

    from agentrl.envs.server import build_app

    token = read_token(cfg.token_var)
    bundle = instantiate(cfg.env, _convert_="all")
    sandbox = OmegaConf.to_container(cfg.sandbox, resolve=True)
    app = build_app(
        bundle,
        max_concurrent_envs=cfg.max_concurrent_envs,
        token=token,
        reward=cfg.reward,
        sandbox=sandbox,
        tool_timeout=cfg.tool_timeout,
        reset_timeout=cfg.reset_timeout,
        session_idle_timeout=cfg.session_idle_timeout,
        # Readable only: the sandbox adds this process's pid and a random token, so a server restarted on the
        # same port is a new owner and reaps what its killed predecessor left.
        sandbox_name=f"{bundle.name}-{cfg.port}",
    )
    log.info("serving %s on http://%s:%s (sandbox %s)", bundle.name, cfg.host, cfg.port, sandbox["kind"])
    run_server(app, cfg.host, cfg.port, log_level=cfg.log_level)


register_configs()  # the env and sandbox groups, and conf/serve.yaml's schema (agentrl/config/serve.py)


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="serve")
def main(cfg: DictConfig) -> None:
    serve(cfg)


if __name__ == "__main__":
    main()
