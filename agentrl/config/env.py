"""Schemas of the `env` group: which bundle, and the server that serves it."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class EnvServerConfig:
    # null: start a server for this run on this machine; else the URL of one already running.
    url: str | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    max_concurrent_envs: int = 64
    tool_timeout: float = 60.0  # seconds
    reset_timeout: float = 600.0  # seconds a reset may wait for room on a full or restarting server
    # Seconds a rollout keeps trying while nothing listens at the URL (refused, unknown host, no route)
    # before it is flagged env_unreachable; shorter than reset_timeout so a dead server stops a run fast.
    connect_timeout: float = 30.0
    # The *name* of the environment variable that holds the bearer token; the token never enters config.
    token_var: str | None = None


@dataclass
class EnvConfig:
    _target_: str = "agentrl.envs.bundles.load_bundle"
    # A bundle name shipped with agentrl (gridsim, arith) or a path to a bundle folder.
    bundle: str = MISSING
    train_split: str = "train"
    eval_split: str = "eval"
    server: EnvServerConfig = field(default_factory=EnvServerConfig)


@dataclass
class GridSimEnvConfig(EnvConfig):
    bundle: str = "gridsim"
    # full: the natural-language prompt for real LLMs; compact: the same facts in a few dozen tokens.
    prompt_style: str = "full"


@dataclass
class ArithEnvConfig(EnvConfig):
    bundle: str = "arith"
    # Optional DAPO-style JSON Lines file of your own (prompt/label keys below) served as the train split.
    data_file: str | None = None
    prompt_key: str = "prompt"
    label_key: str = "label"
