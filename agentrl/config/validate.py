"""Refuses keys that a typed config does not declare, including those added with Hydra's `+key=value`.

Struct mode already refuses `trainer.lrr=1`, but Hydra applies `+trainer.lrr=1` with OmegaConf's `force_add`,
which bypasses struct mode, so a typo following Hydra's own hint ("add a + prefix") used to be accepted and
silently ignored. Every node made from a schema keeps its dataclass as `object_type`; any key it holds beyond
that dataclass's fields can only have come from such an append.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, ListConfig

# Keys the root config holds besides RunConfig's fields: Hydra's own node.
_ROOT_EXTRAS = frozenset({"hydra"})


class UnknownKeyError(ValueError):
    """A typed config holds a key its schema does not declare."""


def _schema(node: DictConfig) -> type | None:
    t = node._metadata.object_type
    return t if t is not None and dataclasses.is_dataclass(t) else None


def added_keys(cfg: DictConfig) -> list[tuple[str, type]]:
    """(full key, schema) of every key a typed node holds that its schema does not declare."""
    found: list[tuple[str, type]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, DictConfig):
            if node._is_missing() or node._is_none() or node._is_interpolation():
                return
            schema = _schema(node)
            fields = {f.name for f in dataclasses.fields(schema)} if schema else None
            for key in node.keys():
                full = f"{path}.{key}" if path else str(key)
                if fields is not None and key not in fields and not (path == "" and key in _ROOT_EXTRAS):
                    found.append((full, schema))
                    continue
                if path == "" and key in _ROOT_EXTRAS:
                    continue
                walk(node._get_node(key), full)
        elif isinstance(node, ListConfig) and not (node._is_missing() or node._is_none()):
            for i in range(len(node)):
                walk(node._get_node(i), f"{path}[{i}]")

    walk(cfg, "")
    return found


def check_typed_keys(cfg: DictConfig) -> None:
    """Raise UnknownKeyError naming the first undeclared key (as struct mode words it) and its schema's keys."""
    bad = added_keys(cfg)
    if not bad:
        return
    full, schema = bad[0]
    declared = ", ".join(f.name for f in dataclasses.fields(schema) if not f.name.startswith("_"))
    others = f" (and {', '.join(k for k, _ in bad[1:])})" if len(bad) > 1 else ""
    raise UnknownKeyError(
        f"Key '{full.rpartition('.')[2]}' not in '{schema.__name__}' full_key: {full}{others}: a typed config "
        f"takes only its schema's keys, and '+' cannot add one. {schema.__name__}'s keys: {declared}")


def install_compose_check() -> None:
    """Run check_typed_keys whenever Hydra composes a config (so `--cfg job` refuses too, not only a run).

    Hydra 1.3 has no public hook between applying overrides and using the config; this wraps the one static
    method that applies them (hydra-core is pinned to 1.3.8 in pyproject.toml). Idempotent.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import ConfigCompositionException

    original = ConfigLoaderImpl._apply_overrides_to_config
    if getattr(original, "_agentrl_checked", False):
        return

    def apply_then_check(overrides: Any, cfg: DictConfig) -> None:
        original(overrides, cfg)
        try:
            check_typed_keys(cfg)
        except UnknownKeyError as err:
            raise ConfigCompositionException(str(err)) from None

    apply_then_check._agentrl_checked = True  # type: ignore[attr-defined]
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(apply_then_check)  # type: ignore[method-assign]
