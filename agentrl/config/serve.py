"""Schema of `python -m agentrl.envs.serve` (conf/serve.yaml): serve one bundle over the OpenEnv protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING


@dataclass
class ServeConfig:
    env: Any = MISSING
    sandbox: Any = MISSING
    # The served env's own server settings (env.server, one home: agentrl/config/env.py); override either.
    host: str = II("env.server.host")
    port: int = 8200
    token_var: str | None = II("env.server.token_var")  # the variable's *name*, never the token itself
    max_concurrent_envs: int = II("env.server.max_concurrent_envs")
    tool_timeout: float = II("env.server.tool_timeout")
    reset_timeout: float = II("env.server.reset_timeout")
    session_idle_timeout: float = II("env.server.session_idle_timeout")
    reward: str | None = None
    log_level: str = "info"
