"""Refuses keys that a typed config does not declare, including those added with Hydra's `+key=value`.

Struct mode already refuses `trainer.lrr=1`, but Hydra applies `+trainer.lrr=1` with OmegaConf's `force_add`,
which bypasses struct mode, so a typo following Hydra's own hint ("add a + prefix") used to be accepted and
silently ignored. Every node made from a schema keeps its dataclass as `object_type`; any key it holds beyond
that dataclass's fields can only have come from such an append.

Both refusals read the same: the key, its schema, the schema's keys closest to it (`did you mean trainer.lr?`) and
all of them. Struct mode's own refusal, as Hydra words it, advises the `+` that is refused next.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
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
            fields = {f.name for f in dataclasses.fields(schema)} if schema else set()
            keys: list[Any] = list(node.keys())
            for key in keys:
                full = f"{path}.{key}" if path else str(key)
                if schema is not None and key not in fields and not (path == "" and key in _ROOT_EXTRAS):
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


def unknown_key_message(full: str, schema: type, others: str = "") -> str:
    """Why `full` is refused: its schema, the declared keys closest to its last part, and all declared keys."""
    parent, _, key = full.rpartition(".")
    declared = [f.name for f in dataclasses.fields(schema) if not f.name.startswith("_")]
    near = difflib.get_close_matches(key, declared, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(f'{parent}.{n}' if parent else n for n in near)}?" if near else ""
    return (f"Key '{key}' not in '{schema.__name__}' full_key: {full}{others}: a typed config takes only its "
            f"schema's keys, and '+' cannot add one.{hint} {schema.__name__}'s keys: {', '.join(declared)}")


def check_typed_keys(cfg: DictConfig) -> None:
    """Raise UnknownKeyError naming the first undeclared key (as struct mode words it) and its schema's keys."""
    bad = added_keys(cfg)
    if not bad:
        return
    full, schema = bad[0]
    others = f" (and {', '.join(k for k, _ in bad[1:])})" if len(bad) > 1 else ""
    raise UnknownKeyError(unknown_key_message(full, schema, others))


def first_unknown_key(cfg: DictConfig, dotted: str) -> tuple[str, type] | None:
    """(the path to its first key a typed node lacks, that node's schema) for an override's `dotted` key; None when
    every key exists or the first missing one is under an untyped node or a list."""
    node: Any = cfg
    path: list[str] = []
    for part in dotted.split("."):
        if not isinstance(node, DictConfig):
            return None
        if part not in node:
            schema = _schema(node)
            return (".".join([*path, part]), schema) if schema is not None else None
        path.append(part)
        node = node._get_node(part)
    return None


_NOT_OVERRIDDEN = re.compile(r"Could not override '([^']+)'")
# Hydra's words when a config of the defaults list (a recipe) sets a key the schema chosen for its group lacks.
_RECIPE_KEY = re.compile(r"^In '(recipe/[^']+)': ConfigKeyError raised while composing config:\n"
                         r"Key '[^']+' not in '(\w+)'\s+full_key: ([\w.]+)")


def recipe_key_hint(message: str) -> str | None:
    """Hydra's refusal of a key a recipe sets, with what to do: the recipe was written for other group choices
    (`+recipe=gridsim_grpo trainer=sft` keeps GRPO's `trainer.prompts_per_step`, which SFT's schema lacks). None
    when the message is not that refusal."""
    found = _RECIPE_KEY.match(message)
    if found is None:
        return None
    recipe, schema, key = found.groups()
    group = key.split(".")[0]
    return (f"{message}\n{recipe} sets {key}, which {schema} (your {group} choice) does not declare: a recipe's "
            f"settings are written for the {group} it chooses itself. Use a recipe written for your choice "
            f"(python -m agentrl --help lists the recipes; each one's defaults name the groups it picks), or keep the "
            f"recipe's own {group}.")


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
    compose = ConfigLoaderImpl._compose_config_from_defaults_list

    def compose_with_hint(self: Any, *args: Any, **kwargs: Any) -> DictConfig:
        try:
            return compose(self, *args, **kwargs)
        except ConfigCompositionException as err:
            hint = recipe_key_hint(str(err))
            if hint is None:
                raise
            raise ConfigCompositionException(hint) from None

    def apply_then_check(overrides: Any, cfg: DictConfig) -> None:
        try:
            original(overrides, cfg)
        except ConfigCompositionException as err:
            # struct mode refused a key; Hydra's advice (prefix a +) would be refused next: say what to use instead
            named = _NOT_OVERRIDDEN.match(str(err))
            unknown = first_unknown_key(cfg, named.group(1)) if named else None
            if unknown is None:
                raise
            raise ConfigCompositionException(unknown_key_message(*unknown)) from None
        try:
            check_typed_keys(cfg)
        except UnknownKeyError as err:
            raise ConfigCompositionException(str(err)) from None

    apply_then_check._agentrl_checked = True  # type: ignore[attr-defined]
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(apply_then_check)  # type: ignore[method-assign]
    ConfigLoaderImpl._compose_config_from_defaults_list = compose_with_hint  # type: ignore[method-assign]
