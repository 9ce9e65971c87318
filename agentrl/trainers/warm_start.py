"""The model folder a GRPO run starts from: the base model, a given SFT checkpoint, or the recipe's own SFT warm
start (made on demand under `paths.checkpoint_dir/sft`, keyed by its settings, and reused by every run that asks
for the same one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig


def warm_start_path(cfg: DictConfig, plan: Any, tracker: Any = None) -> str:
    """The folder training starts from: `trainer.warm_start.checkpoint`, the SFT result (made if missing), or
    the base model when the warm start is off."""
    from hydra.utils import instantiate

    from agentrl.trainers.sft import run_sft, sft_checkpoint_path

    ws = cfg.trainer.warm_start
    if not ws.enabled:
        made = instantiate(cfg.model)
        return made if isinstance(made, str) else str(cfg.model.path)
    if ws.checkpoint:
        if not Path(ws.checkpoint).is_dir():
            raise FileNotFoundError(f"trainer.warm_start.checkpoint={ws.checkpoint} does not exist")
        return str(ws.checkpoint)
    path = sft_checkpoint_path(cfg, ws)
    if not (path / "config.json").is_file():
        print(f"warm start: SFT on {ws.teacher} demonstrations for {ws.steps} steps -> {path}", flush=True)
        run_sft(cfg, plan, path, ws)
    return str(path)
