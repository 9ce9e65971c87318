"""Where the config tree, the recipes and the run root are, in a checkout and in an installed wheel.

The project root (the folder `outputs/` goes under, whose `recipes/` join the shipped ones) is, first match wins:
`$AGENTRL_HOME`; the nearest folder from the working folder up that holds a `recipes/` folder (a clone, or a
project of your own); the checkout agentrl is imported from; `~/agentrl`. The config groups (`conf/`) always
come from the installed package: they hold the schemas' options, which belong to the code.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # .../agentrl
_CHECKOUT = _PACKAGE.parent
HOME_ENV = "AGENTRL_HOME"


def _is_checkout() -> bool:
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "conf").is_dir()


def conf_dir() -> Path:
    """The primary config folder: `conf/` in a checkout, `agentrl/_conf` in a wheel."""
    return _CHECKOUT / "conf" if _is_checkout() else _PACKAGE / "_conf"


def recipes_dir() -> Path:
    """The shipped recipes: `recipes/` in a checkout, `agentrl/_recipes` in a wheel."""
    return _CHECKOUT / "recipes" if _is_checkout() else _PACKAGE / "_recipes"


def _working_project() -> Path | None:
    """The nearest folder from the working folder up that holds `recipes/` (None: there is none)."""
    try:
        here = Path.cwd().resolve()
    except OSError:  # the working folder was removed
        return None
    return next((p for p in (here, *here.parents) if (p / "recipes").is_dir()), None)


def _root_and_reason() -> tuple[Path, str]:
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().resolve(), f"${HOME_ENV}"
    if (project := _working_project()) is not None:
        return project, "the working folder's project: it holds recipes/"
    if _is_checkout():
        return _CHECKOUT, "the checkout agentrl runs from"
    return Path.home() / "agentrl", "the default home (no $AGENTRL_HOME, no recipes/ here, not a checkout)"


def project_root() -> Path:
    """The root that `outputs/` lives under (see the module docstring for the order)."""
    return _root_and_reason()[0]


def project_root_reason() -> str:
    """Why `project_root()` is what it is, for the plan's `root` line."""
    return _root_and_reason()[1]


def recipe_dirs() -> list[Path]:
    """Recipe folders, lowest precedence first: the shipped ones, then the project root's `recipes/` if any."""
    shipped = recipes_dir()
    own = project_root() / "recipes"
    return [shipped, own] if own.is_dir() and own.resolve() != shipped.resolve() else [shipped]
