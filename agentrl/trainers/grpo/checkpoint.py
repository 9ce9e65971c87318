"""GRPO checkpoints: model, optimizer, step, RNG states and the MLflow run id, written atomically.

Layout: `<root>/step-000010/` holding `state.pt` (optimizer, step, data cursor, RNG states, run id) and the
model as a Hugging Face folder `model/`, plus `policies/<name>/` for every other trained policy (a role's own
model; its optimizer is in `state.pt`) and `agentrl_run.json` (the run's config, which a resume is checked against:
`resume.py`). A checkpoint is written into `.step-000010.tmp-*` and renamed into
place only when complete, so a kill or a full disk leaves the previous checkpoint untouched.
"""

from __future__ import annotations

import errno
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from agentrl.fsutil import atomic_dir
from agentrl.trainers.common.resume import write_record

_STEP_DIR = re.compile(r"^step-(\d{6,})$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


def rng_state() -> dict[str, Any]:
    """Python's and torch's RNG states."""
    return {"python": random.getstate(), "torch": torch.random.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.random.set_rng_state(state["torch"])


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "state.pt").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(root: Path) -> Path | None:
    found = checkpoints(root)
    return found[-1][1] if found else None


def policy_path(checkpoint: Path, name: str) -> Path:
    """The Hugging Face folder of policy `name` (not the shared model) inside checkpoint folder `checkpoint`."""
    return Path(checkpoint) / "policies" / name


def save(root: Path, step: int, *, model: Any, tokenizer: Any, state: dict[str, Any], keep: int,
         policies: Mapping[str, tuple[Any, Any]] | None = None, record: dict[str, Any] | None = None) -> Path:
    """Write checkpoint `step` under `root` atomically, then keep only the newest `keep` checkpoints.

    `policies` maps each further policy's name to its (model, tokenizer), saved under `policies/<name>/`;
    `record` is the run's `resume.checkpoint_record`.
    """
    root = Path(root)
    target = root / f"step-{step:06d}"
    try:
        with atomic_dir(target) as tmp:
            model.save_pretrained(tmp / "model")
            tokenizer.save_pretrained(tmp / "model")
            for name, (other, other_tokenizer) in (policies or {}).items():
                other.save_pretrained(policy_path(tmp, name))
                other_tokenizer.save_pretrained(policy_path(tmp, name))
            if record is not None:
                write_record(tmp, record, step)
            torch.save({**state, "step": step, "rng": rng_state()}, tmp / "state.pt")
    except OSError as exc:
        why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else str(exc)
        good = latest(root)
        raise CheckpointError(f"could not write checkpoint {target}: {why}; the last good checkpoint is "
                              f"{good or 'none'} and was not touched") from exc
    for _, old in checkpoints(root)[:-max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_state(path: Path) -> dict[str, Any]:
    """The training state of checkpoint folder `path` (the model is at `path / 'model'`)."""
    try:
        return torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
