"""LoRA adapters as the remote engines load them (`inference=vllm`, `inference=sglang`): a PEFT folder.

The learner pushes `peft.get_peft_model_state_dict(model)` (names such as
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`) with the run's `model.lora`; the engine saves it
as `adapter_config.json` + `adapter_model.safetensors`, the layout vLLM's and SGLang's LoRA loaders read, and only
that folder travels: the base weights are never re-sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.inference.engines.weight_folders import ADAPTER_PREFIX, new_folder, save_tensors
from agentrl.models.lora_folder import ADAPTER_CONFIG, ADAPTER_WEIGHTS

# vLLM accepts only these --max-lora-rank values (vllm/config/lora.py MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The name an adapter folder given as the start model is served under (vLLM and SGLang).
START_ADAPTER = "agentrl-lora-v0"


def adapter_problem(adapter: Mapping[str, Any], rank: int) -> str | None:
    """Why `adapter` is not a PEFT LoRA state dict of rank `rank` (None when it is)."""
    if not adapter:
        return "the adapter state dict is empty"
    stray = sorted(k for k in adapter if ".lora_A." not in k and ".lora_B." not in k)
    if stray:
        return (f"{len(stray)} tensors are not LoRA weights (lora_A/lora_B), e.g. {stray[:2]}: push the output of "
                f"peft.get_peft_model_state_dict, not the whole model")
    for name, tensor in adapter.items():
        r = tensor.shape[0] if ".lora_A." in name else tensor.shape[-1]
        if r != rank:
            return f"{name} has rank {r}, but model.lora.rank is {rank}"
    return None


def peft_config(lora: Any, base_model: str | Path) -> dict[str, Any]:
    """`adapter_config.json` for `model.lora` (the fields PEFT writes that the engines' loaders read)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base_model),
            "r": int(lora.rank), "lora_alpha": float(lora.alpha), "lora_dropout": float(lora.dropout),
            "target_modules": sorted(lora.target_modules), "bias": "none", "use_rslora": False,
            "modules_to_save": None, "fan_in_fan_out": False, "inference_mode": True}


def adapter_folder(adapter: Mapping[str, Any], lora: Any, base_model: str | Path, root: Path | None = None) -> Path:
    """Save `adapter` (PEFT's state dict) with `lora`'s config as a new PEFT folder (under `root`, or the temp
    folder); a wrong adapter is a ValueError naming what is wrong."""
    if problem := adapter_problem(adapter, int(lora.rank)):
        raise ValueError(f"update_adapter: {problem}")
    folder = new_folder(ADAPTER_PREFIX, root)
    (folder / ADAPTER_CONFIG).write_text(json.dumps(peft_config(lora, base_model), indent=1))
    save_tensors(adapter, folder / ADAPTER_WEIGHTS)
    return folder


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"model.lora.rank={rank} exceeds vLLM's largest --max-lora-rank ({VLLM_LORA_RANKS[-1]})")
