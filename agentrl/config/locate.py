"""Where the config tree, the recipes and the run root are, in a checkout and in an installed wheel."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # .../agentrl
_CHECKOUT = _PACKAGE.parent


def _is_checkout() -> bool:
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "conf").is_dir()


def conf_dir() -> Path:
    """The primary config folder: `conf/` in a checkout, `agentrl/_conf` in a wheel."""
    return _CHECKOUT / "conf" if _is_checkout() else _PACKAGE / "_conf"


def recipes_dir() -> Path:
    """The recipes folder: `recipes/` in a checkout, `agentrl/_recipes` in a wheel."""
    return _CHECKOUT / "recipes" if _is_checkout() else _PACKAGE / "_recipes"


def project_root() -> Path:
    """The root that `outputs/` lives under: $AGENTRL_HOME, else the checkout, else ~/agentrl."""
    if os.environ.get("AGENTRL_HOME"):
        return Path(os.environ["AGENTRL_HOME"]).expanduser().resolve()
    if _is_checkout():
        return _CHECKOUT
    return Path.home() / "agentrl"
