"""The composed run config for a test, as `python -m agentrl` would compose it from `overrides` (no Hydra job)."""

from __future__ import annotations

from omegaconf import DictConfig


def compose_config(*overrides: str) -> DictConfig:
    """`conf/config.yaml` with `overrides` (Hydra syntax), the structured schemas registered; Hydra's global state
    is cleared before and after, so tests can compose one after another."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from agentrl.config import register_configs
    from agentrl.config.locate import conf_dir

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return compose("config", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
