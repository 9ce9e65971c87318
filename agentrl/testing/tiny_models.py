"""The tiny model a CLI run would build, built once per process and copied into the run's model folder.

Every `python -m agentrl` run of a test has a home of its own, so each built the same tiny model again (its
corpus and tokenizer: 5-13 s a run on a 2-core box). The build is deterministic (the same settings give
bit-identical files) and a run reuses a folder built with its settings, so a copy is what the run would have
built. Tests about building or reusing the model leave it out.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

_lock = threading.Lock()
_built: dict[str, Path] = {}
_cache: Path | None = None


def tiny_model_folder(args: Sequence[str], model_dir: str | Path) -> tuple[Path, dict[str, int]] | None:
    """Where the CLI run of `args` keeps its tiny model under `model_dir`, and the model's settings, for `args`
    that set the tiny model's shape (`model.<setting>=<int>`); None when they set none, or choose another model,
    its path or other paths."""
    from omegaconf import OmegaConf

    from agentrl.config.model import TinyModelConfig
    from agentrl.models.tiny import SETTINGS

    shape: dict[str, int] = {}
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "model" or key.startswith(("paths", "model.path", "model._target_")):
            return None
        if key.startswith("model.") and key[len("model."):] in SETTINGS:
            if not value.lstrip("-").isdigit():
                return None  # a sweep over it, or an interpolation: let the run build its own
            shape[key[len("model."):]] = int(value)
    if not shape:
        return None  # the recipe's own model: it may be none of ours (model=hf)
    root = OmegaConf.create({"paths": {"model_dir": str(model_dir)},
                             "model": OmegaConf.merge(OmegaConf.structured(TinyModelConfig), shape)})
    return Path(root.model.path), {k: int(root.model[k]) for k in SETTINGS}


def seed_tiny_model(args: Sequence[str], model_dir: str | Path) -> Path | None:
    """Copy the tiny model the CLI run of `args` would build into `model_dir` (unless a folder is there);
    returns its folder, or None when `args` need no tiny model of the default kind (see tiny_model_folder)."""
    found = tiny_model_folder(args, model_dir)
    if found is None:
        return None
    target, settings = found
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(_built_once(target.name, settings), target)
    return target


def shared_tiny_model(**settings: int) -> str:
    """The tiny model of `settings` (ensure_tiny_model's keywords, its defaults for the rest), built once per
    process and shared: for tests that only read it."""
    # Only the folder name of tiny_model_folder is used: the copy lives in the process's cache.
    found = tiny_model_folder([f"model.{k}={v}" for k, v in settings.items()] or ["model.seed=0"], "/")
    assert found is not None, settings
    target, full = found
    return str(_built_once(target.name, full))


def _built_once(name: str, settings: dict[str, int]) -> Path:
    global _cache
    from agentrl.models.tiny import ensure_tiny_model

    key = f"{name}:{sorted(settings.items())}"
    with _lock:
        if key not in _built:
            if _cache is None:
                _cache = Path(tempfile.mkdtemp(prefix="agentrl-test-tiny-models-"))
                atexit.register(shutil.rmtree, _cache, True)
            _built[key] = Path(ensure_tiny_model(str(_cache / str(len(_built)) / name), **settings))
        return _built[key]
