"""LoRA adapter folders (PEFT's format): `adapter_config.json` + `adapter_model.safetensors` (+ the tokenizer).

With `model.lora.enabled`, every model folder a run writes (the SFT warm start, a checkpoint's `model/`, the
`final_model`) is such a folder: the adapter plus `base_model_name_or_path`, the base model's folder it
applies to. Whatever loads a model folder asks `adapter_base` first.
"""

from __future__ import annotations

import json
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter_folder(path: str | Path) -> bool:
    """True when `path` is a folder holding a PEFT adapter (its `adapter_config.json`)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_model_folder(path: str | Path) -> bool:
    """True for a Hugging Face model folder (`config.json`) or a LoRA adapter folder (`adapter_config.json`)."""
    return (Path(path) / "config.json").is_file() or is_adapter_folder(path)


def adapter_config(path: str | Path) -> dict:
    """The adapter folder's `adapter_config.json`, read; ValueError naming the file when it is unreadable."""
    file = Path(path) / ADAPTER_CONFIG
    try:
        config = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: not a readable adapter config ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{file}: not a JSON object")
    return config


def adapter_base(path: str | Path) -> str | None:
    """The base model folder the adapter at `path` applies to, or None when `path` is a full model folder.

    Raises ValueError when the adapter names no base, or a base that is not a local model folder (nothing is
    fetched from a hub).
    """
    if not is_adapter_folder(path):
        return None
    base = adapter_config(path).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"adapter folder {path} names no base model (base_model_name_or_path in {ADAPTER_CONFIG})")
    if not (Path(base) / "config.json").is_file():
        raise ValueError(f"adapter folder {path} applies to base model {base}, which is not a local model folder "
                         "(moved or deleted? set base_model_name_or_path in its adapter_config.json)")
    return str(base)


def adapter_scaling(config: dict) -> float:
    """The factor PEFT scales B @ A by: alpha / r, or alpha / sqrt(r) under rsLoRA."""
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    return alpha / rank ** 0.5 if config.get("use_rslora") else alpha / rank


def folder_lora(path: str | Path):  # -> agentrl.config.model.LoraConfig
    """The adapter folder's own settings as `model.lora` (enabled, push=adapter): what an engine serving the folder
    needs (rank, modules) when the run itself set no `model.lora`, e.g. `agentrl eval` of a LoRA run's final model."""
    from agentrl.config.model import LoraConfig

    c = adapter_config(path)
    modules = c.get("target_modules") or []
    return LoraConfig(enabled=True, rank=int(c["r"]), alpha=float(c.get("lora_alpha", c["r"])),
                      dropout=float(c.get("lora_dropout", 0.0)),
                      target_modules=[modules] if isinstance(modules, str) else sorted(modules))
