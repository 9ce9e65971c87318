"""Every default has one home, the schema dataclasses in agentrl/config/ (issue 28).

A conf/<group>/<option>.yaml only chooses: it names what it builds (`_target_`, the schema's) and holds the values
that differ from its schema. What Hydra builds from a schema reads the schema's defaults instead of restating
them, and nothing below the plan falls back to a default of its own for a key the schema types.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import agentrl
from agentrl.config.locate import conf_dir, project_root
from agentrl.config.register import SCHEMAS
from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.testing.config import compose_config

OPTIONS = [(group, option) for group, options in SCHEMAS.items() for option in options]
PACKAGE = Path(agentrl.__file__).parent


def leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every leaf of a plain container; an empty dict is a leaf."""
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in leaves(v, (*path, str(k)))]
    return [(path, node)]


def schema_value(schema: Any, path: tuple[str, ...]) -> Any:
    node = OmegaConf.to_container(OmegaConf.structured(schema), resolve=False)
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return KeyError
        node = node[key]
    return node


def option_file(group: str, option: str) -> dict[str, Any]:
    raw = OmegaConf.to_container(OmegaConf.load(conf_dir() / group / f"{option}.yaml"), resolve=False)
    raw.pop("defaults", None)
    return raw


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_a_conf_option_restates_no_schema_default(group: str, option: str):
    schema = SCHEMAS[group][option]
    restated = [f"{'.'.join(path)}: {value!r}" for path, value in leaves(option_file(group, option))
                if path != ("_target_",) and schema_value(schema, path) == value]
    assert not restated, (f"conf/{group}/{option}.yaml restates {schema.__name__}'s defaults (remove them; the "
                          f"schema is their one home): {restated}")


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_a_conf_option_names_what_it_builds(group: str, option: str):
    """Reading conf/ shows what is made: the option carries its schema's `_target_` (and cannot disagree)."""
    target = schema_value(SCHEMAS[group][option], ("_target_",))
    named = option_file(group, option).get("_target_")
    if target in (KeyError, "???"):
        assert named is None, f"conf/{group}/{option}.yaml names a _target_ its schema does not build"
    else:
        assert named == target, f"conf/{group}/{option}.yaml: _target_ {named!r}, its schema builds {target!r}"


def test_the_serve_config_restates_no_env_server_default():
    from agentrl.config.serve import ServeConfig

    raw = OmegaConf.to_container(OmegaConf.load(conf_dir() / "serve.yaml"), resolve=False)
    for key in ("defaults", "hydra", "env", "sandbox"):
        raw.pop(key, None)
    restated = {k: v for k, v in raw.items() if schema_value(ServeConfig, (k,)) == v}
    assert not restated, f"conf/serve.yaml restates ServeConfig's defaults: {restated}"


# ------------------------------------------------------------------ max_staleness: one owner


def test_max_staleness_has_one_owner_and_the_docs_say_its_value():
    default = GRPOTrainerConfig().max_staleness
    assert default == 1, "trainer=grpo overlaps play and train by default (the behaviour users got)"
    assert "max_staleness:" not in option_file("trainer", "grpo"), "conf/trainer/grpo.yaml restates it"
    cfg = compose_config("trainer=grpo")
    assert cfg.trainer.max_staleness == default
    readme = (project_root() / "README.md").read_text(encoding="utf-8")
    said = re.findall(r"trainer\.max_staleness=[^`]*` \(default (\d)", readme)
    assert said == [str(default)], f"README's config table says the default is {said}, the schema {default}"


# ------------------------------------------------------------------ what Hydra builds reads the schema

# Targets whose defaults are still restated, each with its reason or owner: remove an entry with the fix.
RESTATING = {
    # Runs in a bare stdlib process (a Docker sandbox rebuilds the bundle from its spec): it cannot import the
    # schema (omegaconf), and the plan always passes both split names.
    "agentrl.envs.bundles.load_bundle": "its split names' defaults stay literal (stdlib only)",
    "agentrl.tracking.mlflow_tracker.MLflowTracker": "TODO(#28, plan/tracking): read MLflowLoggerConfig's",
}


def literal_defaults(obj: Any) -> dict[str, str]:
    """Parameter -> its default's source, for defaults written as literals (None and empty containers aside:
    they mean "not given", not a value)."""
    # A dataclass's __init__ is generated: its defaults are the class body's.
    target = obj.__init__ if inspect.isclass(obj) and not dataclasses.is_dataclass(obj) else obj
    tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
    definition = tree.body[0]
    pairs: list[tuple[str, ast.expr]] = []
    if isinstance(definition, ast.ClassDef):  # a dataclass: its fields' defaults
        pairs = [(n.target.id, n.value) for n in definition.body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None]
    else:
        args = definition.args
        positional = [*args.posonlyargs, *args.args]
        pairs = [(a.arg, d) for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults,
                                            strict=True)]
        pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]

    return {name: ast.unparse(node) for name, node in pairs if restates_a_value(node)}


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_what_hydra_builds_reads_the_schemas_defaults(group: str, option: str):
    schema = SCHEMAS[group][option]
    target = schema_value(schema, ("_target_",))
    if target in (KeyError, "???") or target in RESTATING:
        pytest.skip(f"{group}={option}: {RESTATING.get(target, 'builds nothing')}")
    module, _, name = target.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    fields = {f.name for f in dataclasses.fields(schema)}
    restated = {k: v for k, v in literal_defaults(obj).items() if k in fields}
    assert not restated, (f"{target} restates {schema.__name__}'s defaults {restated}: make them required or "
                          f"read the schema's (e.g. = {schema.__name__}.<field>)")


def test_the_env_servers_deadlines_are_stated_once():
    """tool_timeout=60 and reset_timeout=600 used to be written in seven places: server, client, serve, rows,
    the CLI's flags, the rows' metadata and the schema."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "config" / "env.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            pairs: list[tuple[str, ast.expr]] = []
            if isinstance(node, ast.arguments):
                positional = [*node.posonlyargs, *node.args]
                pairs = [(a.arg, d) for a, d in zip(positional[len(positional) - len(node.defaults):],
                                                    node.defaults, strict=True)]
                pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True) if d]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                pairs = [(node.target.id, node.value)]
            elif isinstance(node, ast.Call):
                pairs = [(k.arg or "", k.value) for k in node.keywords if k.arg == "default"]
                flag = next((a.value for a in node.args if isinstance(a, ast.Constant)), "")
                pairs = [(str(flag).lstrip("-").replace("-", "_"), v) for _, v in pairs]
                if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2 \
                        and isinstance(node.args[0], ast.Constant):
                    pairs.append((str(node.args[0].value), node.args[1]))
            for name, value in pairs:
                if name in ("tool_timeout", "reset_timeout") and isinstance(value, ast.Constant) \
                        and isinstance(value.value, int | float):
                    found.append(f"{path.relative_to(PACKAGE)}:{value.lineno}: {name}={value.value}")
    assert not found, "restated env server deadlines (use config.env.TOOL_TIMEOUT_S / RESET_TIMEOUT_S):\n" + \
        "\n".join(found)


# ------------------------------------------------------------------ no fallback below the plan

# `.get(key, literal)` on a config node for a key the schema types, left in modules other helpers are converting
# to the typed plan.settings (issue 28): remove an entry with the fix.
FALLBACKS_LEFT = {
    "tracking/hydra_callback.py": "TODO(#28, plan part)",
}
# Protocol dicts whose keys happen to share a schema field's name (a row's metadata, a request's body).
NOT_CONFIG = re.compile(r"^(meta|data|r|kwargs|body|row|metadata|settings|env_settings|\(.*\))$")
# What `getattr(<this>, "key", default)` reads typed settings from: the plan's settings and a group of them
# (`settings.trainer`, `plan.settings.model`, `run.env`), or the names a settings group goes by (`t`, `c`, `ws`,
# `model_cfg`). Other objects (a tokenizer, a bundle, a Hugging Face config) may lack a key of the same name.
SETTINGS_LIKE = re.compile(r"^(?:\w+\.)?(?:\w*settings|run|t|c|s|ws|cfg|\w+_cfg)(?:\.\w+)*$")


def typed_keys() -> set[str]:
    names: set[str] = set()

    def walk(cls: type) -> None:
        for f in dataclasses.fields(cls):
            names.add(f.name)
            if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
                walk(f.default_factory)

    for options in SCHEMAS.values():
        for cls in options.values():
            walk(cls)
    return names


def restates_a_value(node: ast.expr) -> bool:
    """A fallback that is a value of its own (a literal, a non-empty tuple or list), not None ("no such key")."""
    if isinstance(node, ast.UnaryOp):
        return restates_a_value(node.operand)
    if isinstance(node, ast.Constant):
        return node.value is not None
    return isinstance(node, ast.Tuple | ast.List) and bool(node.elts)


def config_fallbacks(source: str, keys: set[str]) -> list[tuple[int, str]]:
    """(line, call) of each `.get("key", literal)` on a config node and `getattr(settings, "key", literal)` on
    typed settings, for a key the schema types."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[-2], ast.Constant)
                and node.args[-2].value in keys and restates_a_value(node.args[-1])):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2:
            if isinstance(node.args[1], ast.Constant) and not NOT_CONFIG.match(ast.unparse(node.func.value)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3:
            if SETTINGS_LIKE.match(ast.unparse(node.args[0])):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_fallback_check_sees_get_and_getattr():
    keys = {"tis_cap", "temperature", "episode_roles"}
    source = """
cfg.trainer.get("temperature", 1.1)
getattr(settings.trainer, "tis_cap", 0.0)
getattr(t, "episode_roles", ("solver",))
getattr(plan.settings.trainer, "tis_cap", -1)
getattr(settings.env, "tis_cap", None)  # may the option lack it: allowed
getattr(tokenizer, "temperature", 1.0)  # not settings
row.get("temperature", 1.0)  # a protocol dict
"""
    assert [line for line, _ in config_fallbacks(source, keys)] == [2, 3, 4, 5]


def test_no_config_fallback_restates_a_typed_default():
    """`cfg.trainer.get("temperature", 1.1)` and `getattr(t, "tis_cap", 0.0)` were how a second default hid below
    the plan (the getattr one had drifted: 0 there, 2.0 in the schema)."""
    keys, found = typed_keys(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where in FALLBACKS_LEFT:
            continue
        found += [f"{where}:{line}: {call}" for line, call in config_fallbacks(path.read_text(encoding="utf-8"), keys)]
    assert not found, "a config key's default restated as a fallback (read plan.settings):\n" + "\n".join(found)
