"""`env.bundles` of `env=mix` read and checked: each group's weight, name and settings, typed by its env option's
schema (so a group's defaults are that option's, and a misspelled key fails naming it).

Runs where the plan is built (it needs OmegaConf and the schemas); the mix's `spec()` holds the groups resolved,
so a sandbox rebuilds the mix without this module.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

KEY = "env.bundles"
# A group's own keys, beside its env option's: which option, its share of the train rows, its warm-start teacher.
GROUP_KEYS = ("name", "env", "weight", "demonstrations")
# Group names become metric names (train/reward/<name>) and task-id prefixes.
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class MixConfigError(ValueError):
    """`env.bundles` names an unknown bundle, a bad weight or a key its bundle does not take."""


def env_schemas() -> dict[str, type]:
    """Env option name -> its schema dataclass (the `env` group's options, the mix itself excepted)."""
    from agentrl.config.register import SCHEMAS

    return {name: schema for name, schema in SCHEMAS["env"].items() if name != "mix"}


def check_weight(value: Any, where: str) -> float:
    """A group's weight: a finite number above 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MixConfigError(f"{where} must be a number (the group's share of the train rows), got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise MixConfigError(f"{where} must be a finite number above 0, got {value!r}")
    return float(value)


def as_groups(bundles: Any) -> list[dict[str, Any]]:
    """`env.bundles` as a list of plain group dicts, each with its `name`: from {name: weight}, {name: {...}}
    or [{name, ...}, ...]."""
    if hasattr(bundles, "_content"):  # a DictConfig / ListConfig handed over as is
        from omegaconf import OmegaConf

        bundles = OmegaConf.to_container(bundles, resolve=True)
    if bundles is None or (hasattr(bundles, "__len__") and not isinstance(bundles, str) and not len(bundles)):
        raise MixConfigError(f"{KEY} is empty: env=mix needs at least one bundle and its weight, e.g. "
                             f"'{KEY}={{gridsim:0.7,reasoning_gym:0.3}}'")
    if isinstance(bundles, Mapping):
        groups = []
        for name, value in bundles.items():
            if isinstance(value, Mapping):
                groups.append({"name": str(name), **value})
            else:
                groups.append({"name": str(name), "weight": check_weight(value, f"{KEY}.{name}")})
        return groups
    if isinstance(bundles, list | tuple):
        groups = []
        for i, group in enumerate(bundles):
            if not isinstance(group, Mapping):
                raise MixConfigError(f"{KEY}[{i}] must be a group ({{name, weight, ...}}), got {group!r}")
            name = group.get("name", group.get("env"))
            if name is None:
                raise MixConfigError(f"{KEY}[{i}] has neither a name nor an env")
            groups.append({**group, "name": str(name)})
        return groups
    raise MixConfigError(f"{KEY} must map bundle names to weights (or be a list of groups), got {bundles!r}")


def typed_options(option: str, keys: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The env option's settings with `keys` on top, typed by its schema; `load_bundle`'s keyword arguments."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schemas = env_schemas()
    if option not in schemas:
        raise MixConfigError(f"{where}: unknown bundle {option!r}; env=mix takes the env options "
                             f"{', '.join(sorted(schemas))}")
    schema = schemas[option]
    fields = {f.name for f in dataclasses.fields(schema)}
    for key in keys:
        if key in ("_target_", "server"):
            raise MixConfigError(f"{where}.{key}: set it on the mix (env.{key}), not on one of its bundles")
        if key not in fields:
            raise MixConfigError(f"{where}.{key}: env option {option} has no setting {key!r}; it takes "
                                 f"{', '.join(sorted(fields - {'_target_', 'server'}))}")
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema), dict(keys))
        settings = dataclasses.asdict(OmegaConf.to_object(node))
    except OmegaConfBaseException as exc:
        raise MixConfigError(f"{where}: {str(exc).splitlines()[0]}") from None
    target = settings.pop("_target_")
    if target != "agentrl.envs.bundles.load_bundle":
        raise MixConfigError(f"{where}: env option {option} is built by {target}, not a bundle loader")
    settings.pop("server", None)
    return settings


def mix_groups(bundles: Any) -> list[dict[str, Any]]:
    """The mix's groups resolved: [{name, weight, demonstrations, spec (load_bundle's keyword arguments)}]."""
    groups, seen = [], set()
    for raw in as_groups(bundles):
        name = raw["name"]
        where = f"{KEY}.{name}"
        if not NAME.match(name):
            raise MixConfigError(f"{where}: a group name holds only letters, digits, '_', '.' and '-'")
        if name in seen:
            raise MixConfigError(f"{where}: two groups share the name {name!r}; give each its own name")
        seen.add(name)
        option = str(raw.get("env", name))
        if option == "mix":
            raise MixConfigError(f"{where}: a mix cannot hold another mix")
        if "weight" not in raw:
            raise MixConfigError(f"{where}.weight is not set: every group needs its weight")
        weight = check_weight(raw["weight"], f"{where}.weight")
        teacher = raw.get("demonstrations")
        keys = {k: v for k, v in raw.items() if k not in GROUP_KEYS}
        groups.append({"name": name, "weight": weight, "demonstrations": None if teacher is None else str(teacher),
                       "spec": typed_options(option, keys, where)})
    return groups
