"""The folders a push writes for an engine to load (`inference=vllm`, `inference=sglang`, the engine process): a
state dict saved as a model folder (`weights_folder`), or a LoRA adapter saved as a PEFT folder
(`remote_adapters.adapter_folder`). Each is made under a prefix of its own, so `made_here` tells a folder a push
wrote (the engine may delete it) from one the caller handed in (never deleted).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WEIGHTS_PREFIX = "agentrl-weights-"  # folders made by `weights_folder`
ADAPTER_PREFIX = "agentrl-adapter-"  # folders made by `remote_adapters.adapter_folder`
PREFIXES = (WEIGHTS_PREFIX, ADAPTER_PREFIX)


def new_folder(prefix: str, root: Path | None = None) -> Path:
    """A new empty folder named `prefix...` under `root` (made if missing), or the system's temp folder."""
    if prefix not in PREFIXES:
        raise ValueError(f"new_folder: prefix {prefix!r} is not one of {PREFIXES} (made_here would not know it)")
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def save_tensors(tensors: Mapping[str, Any], path: Path) -> None:
    """`tensors` saved as one safetensors file at `path`."""
    from safetensors.torch import save_file

    # A copy of every tensor: tied weights (embeddings and lm_head) share storage, which save_file refuses.
    save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}, str(path))


def weights_folder(source: Mapping[str, Any] | str | Path, model_path: Path, engine: str,
                   root: Path | None = None) -> Path:
    """A folder a server can load: `source` itself when it is one, else the state dict saved as safetensors beside
    the model's config in a new folder (under `root`, or the system's temp folder)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_dir():
            raise FileNotFoundError(f"weights folder {path} does not exist ({engine} loads whole folders)")
        return path
    folder = new_folder(WEIGHTS_PREFIX, root)
    for name in ("config.json", "generation_config.json"):
        if (model_path / name).is_file():
            shutil.copy(model_path / name, folder / name)
    save_tensors(source, folder / "model.safetensors")
    return folder


def folder_bytes(folder: Path) -> int:
    """The bytes a push sends: every file in `folder` (the servers read it whole)."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def made_here(folder: Path | None) -> bool:
    """Whether `folder` is one a push saved (`weights_folder`, `adapter_folder`: safe to delete), not a folder the
    caller handed in."""
    return folder is not None and folder.name.startswith(PREFIXES)
