"""Typed configuration: one dataclass schema per config-group option, registered in Hydra's ConfigStore."""

from typing import Any

__all__ = ["register_configs"]


def __getattr__(name: str) -> Any:
    # Imported on first use: a bare standard-library process (a sandbox rebuilding a bundle) imports
    # `agentrl.config.bundle_options` without Hydra or OmegaConf.
    if name == "register_configs":
        from agentrl.config.register import register_configs

        return register_configs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
