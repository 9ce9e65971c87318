"""Typed configuration: one dataclass schema per config-group option, registered in Hydra's ConfigStore."""

from agentrl.config.register import register_configs

__all__ = ["register_configs"]
