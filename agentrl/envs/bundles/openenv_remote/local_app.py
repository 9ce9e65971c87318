"""The app `env.serve` names, served here: a module's callable, or an OpenEnv environment folder (its `openenv.yaml`).

OpenEnv's environments (its repository's `envs/<name>/`, or one of your own made by `openenv init`) are folders
holding an `openenv.yaml` manifest whose `app:` says where the server's ASGI app is, relative to the folder
(`server.app:app`). Their `pyproject.toml` maps the folder to a package of the folder's name, and their code
imports relatively (`from ..models import ...`), so the app is imported as `<folder name>.<app module>` with the
folder's parent on `sys.path`, the way `pip install` of that folder would lay it out.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrl.envs.bundles.openenv_remote.teacher import load_callable

MANIFEST = "openenv.yaml"


@dataclass(frozen=True)
class Manifest:
    """What agentrl reads of an environment folder's `openenv.yaml`."""

    folder: Path  # the environment's folder (the manifest's directory), resolved
    name: str  # the environment's name (`name:`, else the folder's)
    app: str  # `module:attribute` of its ASGI app, relative to the folder (`app:`)


@dataclass(frozen=True)
class LocalApp:
    """An ASGI app to serve, the environment's name when a manifest gave one, and a key that names it stably."""

    app: Any
    name: str | None
    key: str


def is_folder_spec(spec: str) -> bool:
    """Whether `env.serve` names a folder (or its openenv.yaml) rather than `package.module:function`."""
    return "/" in spec or spec.endswith((".yaml", ".yml")) or Path(spec).expanduser().is_dir()


def read_manifest(spec: str | Path) -> Manifest:
    """The manifest of the environment folder `spec` names (the folder or its openenv.yaml); ValueError naming
    env.serve when there is none or it lacks what serving needs."""
    path = Path(spec).expanduser().resolve()
    manifest = path / MANIFEST if path.is_dir() else path
    if not manifest.is_file():
        where = f"{path} has no {MANIFEST}" if path.is_dir() else f"{path} does not exist"
        raise ValueError(f"env.serve={spec}: {where} (name an OpenEnv environment folder, the one holding its "
                         f"{MANIFEST}, or an app as package.module:function)")
    try:
        raw = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"env.serve={spec}: {manifest} is not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"env.serve={spec}: {manifest} must be a YAML mapping")
    app = raw.get("app")
    if not isinstance(app, str) or ":" not in app:
        raise ValueError(f"env.serve={spec}: {manifest} has no `app: module:attribute` entry (e.g. "
                         "`app: server.app:app`), so agentrl cannot tell which app serves the environment")
    name = raw.get("name")
    return Manifest(folder=manifest.parent, name=str(name) if name else manifest.parent.name, app=app)


def import_manifest_app(manifest: Manifest, spec: str) -> Any:
    """The object the manifest's `app:` names, imported as the environment's own package would import it."""
    module_name, _, attr = manifest.app.partition(":")
    folder = manifest.folder
    if folder.name.isidentifier():
        # As `pip install <folder>` lays it out: the folder is a package of its name (relative imports work).
        root, qualified = folder.parent, f"{folder.name}.{module_name}"
    else:
        root, qualified = folder, module_name  # not a package name: its modules are imported from inside it
    # Appended, not put first: the folder's siblings must not shadow what this process already imports.
    if str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        module = importlib.import_module(qualified)
    except Exception as exc:  # noqa: BLE001 - the env's own import failed: say which, and why
        raise ValueError(f"env.serve={spec}: importing {qualified} (the app of {folder / MANIFEST}) failed: "
                         f"{type(exc).__name__}: {exc}") from exc
    source = Path(getattr(module, "__file__", None) or "").resolve()
    if not source.is_relative_to(folder):
        raise ValueError(f"env.serve={spec}: {qualified} is imported from {source}, not from {folder} (a module "
                         "of that name is already importable here: rename the folder or uninstall the other)")
    found = getattr(module, attr, None)
    if found is None:
        raise ValueError(f"env.serve={spec}: {qualified} has no {attr!r} (the app {folder / MANIFEST} names)")
    return found


def _is_asgi_app(obj: Any) -> bool:
    """An app object (FastAPI/Starlette, or any `app(scope, receive, send)`) rather than a factory making one."""
    if hasattr(obj, "router"):
        return True
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) == 3


def local_app(spec: str) -> LocalApp:
    """The app `env.serve` names: an environment folder's manifest app, or `package.module:function`'s app."""
    if is_folder_spec(spec):
        manifest = read_manifest(spec)
        found = import_manifest_app(manifest, spec)
        name, key = manifest.name, f"serve:{manifest.name}@{manifest.folder}"
    else:
        _, found = load_callable(spec, "env.serve")
        name, key = None, f"serve:{spec}"
    if not callable(found):
        raise ValueError(f"env.serve={spec}: {found!r} is neither an ASGI app nor a function returning one")
    app = found if _is_asgi_app(found) else found()
    return LocalApp(app=app, name=name, key=key)
