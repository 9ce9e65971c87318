"""The plan's typed settings as plain JSON and back, each group retyped by its schema: how a run's config reaches
another process (a TRL rank) as the same typed config, whose checks that process can then run again."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentrl.config.schema import RunConfig, settings_dict

SCHEMAS_KEY = "_schemas"  # group -> its schema dataclass, "module.Class"


class PortableConfigError(ValueError):
    """A portable config that does not fit its schemas (a key they lack, a schema that is not agentrl's)."""


def to_portable(settings: RunConfig) -> dict[str, Any]:
    """The typed settings (`Plan.settings`) as plain data, plus the schema dataclass each group is."""
    schemas = {}
    for f in dataclasses.fields(settings):
        group = getattr(settings, f.name)
        if dataclasses.is_dataclass(group):
            schemas[f.name] = f"{type(group).__module__}.{type(group).__qualname__}"
    return {**settings_dict(settings), SCHEMAS_KEY: schemas}


def _schema(group: str, name: str) -> type:
    module, _, attr = name.rpartition(".")
    if not module.startswith("agentrl."):
        raise PortableConfigError(f"{group}: schema {name!r} is not under agentrl.*")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise PortableConfigError(f"{group}: schema {name} cannot be imported: {exc}") from exc


def from_portable(data: dict[str, Any]) -> DictConfig:
    """The typed config `to_portable` wrote: every group merged onto its schema, so a key the schema lacks fails
    here and `OmegaConf.to_object` runs the schemas' own checks."""
    data = dict(data)
    schemas = data.pop(SCHEMAS_KEY, {})
    cfg = OmegaConf.structured(RunConfig)
    try:
        for key, value in data.items():
            cfg[key] = OmegaConf.merge(OmegaConf.structured(_schema(key, schemas[key])), value) \
                if key in schemas else value
    except PortableConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - OmegaConf's key and type errors: say them with the group
        raise PortableConfigError(f"{key}: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    return cfg
