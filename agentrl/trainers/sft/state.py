"""An SFT run stopped by Ctrl-C or SIGTERM keeps its progress: the same command continues it.

A stop between two steps writes the trained weights (the adapter's only, under LoRA: the frozen base is reloaded
from its folder), the optimizer, the LR schedule, the batch sampler's and torch's random state and the step to
one file beside the output folder, `<output>.partial/state.pt`. The next SFT to the same output folder loads it
when it was made with the same settings and data (a fingerprint of both is stored with it) and goes on from that
step; a state made otherwise is set aside with a line saying so. A finished run removes its state.

Why beside the output folder: the warm start's folder name is its cache key (the bundle, the data, the base
model, the seed and every SFT setting), so the partial state is found exactly when the same SFT is asked again.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.pt"
STEP_FILE = "step"  # the state's step, readable without loading the state (the closing block names it)


def state_dir(output_dir: str | Path) -> Path:
    """Where an SFT to `output_dir` keeps the state of a stopped run."""
    output_dir = Path(output_dir)
    return output_dir.with_name(f"{output_dir.name}.partial")


def fingerprint(model: Any, data: Sequence[tuple[list[int], list[int]]], settings: dict[str, Any]) -> str:
    """What a saved state must match to be continued: the SFT settings, the trained parameters' names and shapes,
    and the demonstrations (their count and a sample of up to 64 spread over them: hashing 48,000 would cost
    seconds, and any change of data source, teacher or tokenizer changes the sample)."""
    h = hashlib.sha256(repr(sorted(settings.items())).encode())
    for name, p in model.named_parameters():
        if p.requires_grad:
            h.update(f"{name}{tuple(p.shape)}".encode())
    h.update(str(len(data)).encode())
    for i in range(0, len(data), max(1, len(data) // 64)):
        h.update(repr(data[i]).encode())
    return h.hexdigest()[:16]


def save_state(folder: Path, *, step: int, key: str, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
               rng: random.Random) -> Path:
    """Write the state after `step` finished steps, replacing any earlier one whole (a temp file renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "key": key,
             "weights": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": rng.getstate(), "torch_rng": torch.get_rng_state()}
    tmp = folder / f".{STATE_FILE}.tmp"
    try:
        torch.save(state, tmp)
        os.replace(tmp, folder / STATE_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    (folder / STEP_FILE).write_text(str(step))
    return folder / STATE_FILE


def saved_step(folder: Path) -> int | None:
    """The step of the stopped SFT's state in `folder`, or None when there is none."""
    try:
        return int((folder / STEP_FILE).read_text()) if (folder / STATE_FILE).is_file() else None
    except (OSError, ValueError):
        return None


def load_state(folder: Path, *, key: str, steps: int, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
               rng: random.Random) -> int:
    """Restore a saved state into the objects; returns its step, or 0 when there is none or it does not match
    (`key`, or a step outside 1..steps), which is then moved aside."""
    path = folder / STATE_FILE
    if not path.is_file():
        return 0
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        ok = state.get("key") == key and 0 < int(state.get("step", 0)) <= steps
    except Exception as exc:  # noqa: BLE001 - an unreadable state (a torn disk) must not stop a fresh start
        ok, state = False, {"error": exc}
    if not ok:
        aside = folder.with_name(f"{folder.name}.stale")
        shutil.rmtree(aside, ignore_errors=True)
        folder.rename(aside)
        why = state.get("error") or "made with other settings or data"
        print(f"SFT: not continuing the stopped run's state in {folder} ({why}); moved to {aside}, starting over",
              flush=True)
        return 0
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["weights"].items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rng.setstate(state["rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


def clear_state(folder: Path) -> None:
    """A finished run's state is of no more use."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(folder.with_name(f"{folder.name}.stale"), ignore_errors=True)
