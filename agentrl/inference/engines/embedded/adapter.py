"""LoRA adapters in the embedded engine: the engine serves base + adapter as merged weights, W + s * B @ A.

The base's copy of every weight an adapter touches is kept aside (on the CPU) the first time one is applied,
so each push merges onto the base itself, never onto the previous merge: the served weights are exact, and
the engine's forward pass costs what the base's costs. Adapter tensors carry PEFT's names (what
`peft.get_peft_model_state_dict` returns and `adapter_model.safetensors` holds), e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from agentrl.models.lora_folder import ADAPTER_WEIGHTS, adapter_base, adapter_config, adapter_scaling

_PREFIX = "base_model.model."
_PARTS = {".lora_A.weight": "A", ".lora_B.weight": "B"}


def adapter_pairs(adapter: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{base weight name: (A, B)} for the adapter's LoRA tensors; ValueError for a name that is not a LoRA
    tensor or a module with only one of its two matrices."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in adapter.items():
        suffix = next((s for s in _PARTS if key.endswith(s)), None)
        if suffix is None:
            raise ValueError(f"update_adapter: {key} is not a LoRA tensor (lora_A/lora_B); the embedded engine "
                             "applies LoRA adapters only (no modules_to_save, DoRA or bias)")
        module = key.removesuffix(suffix).removeprefix(_PREFIX)
        halves.setdefault(f"{module}.weight", {})[_PARTS[suffix]] = tensor
    if not halves:
        raise ValueError("update_adapter: the adapter holds no tensors")
    pairs = {}
    for name, half in halves.items():
        if set(half) != {"A", "B"}:
            raise ValueError(f"update_adapter: {name} has lora_{''.join(half)} but not its other matrix")
        pairs[name] = (half["A"], half["B"])
    return pairs


class AdapterBase:
    """The base weights under the adapters an engine applies, and the merge of a new adapter onto them."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}  # weight name -> the base's copy, on the CPU

    def merged(self, model: torch.nn.Module, adapter: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
        """The weights `model` serves with `adapter` (scaled by `scaling`) on the base: {name: W + s * B @ A}.

        The first time a weight is named, its current value in `model` is taken as its base. Raises ValueError
        naming a weight the model lacks or a shape that does not fit, before anything is applied.
        """
        params = dict(model.named_parameters())
        out: dict[str, torch.Tensor] = {}
        for name, (a, b) in adapter_pairs(adapter).items():
            if name not in params:
                raise ValueError(f"update_adapter: the model has no weight {name} (the adapter was made for "
                                 "another model?)")
            weight = params[name]
            if a.dim() != 2 or b.dim() != 2 or (b.shape[0], a.shape[1]) != tuple(weight.shape) \
                    or a.shape[0] != b.shape[1]:
                raise ValueError(f"update_adapter: {name} is {tuple(weight.shape)}, the adapter's B @ A is "
                                 f"{tuple(b.shape)} @ {tuple(a.shape)}")
            if name not in self.base:
                self.base[name] = weight.detach().to("cpu", copy=True)
            base = self.base[name].to(weight.device, torch.float32)
            delta = b.to(weight.device, torch.float32) @ a.to(weight.device, torch.float32)
            out[name] = (base + scaling * delta).to(weight.dtype)
        return out


def read_adapter(folder: str | Path) -> tuple[dict[str, torch.Tensor], float]:
    """The LoRA tensors of adapter folder `folder` and their scaling (alpha / r)."""
    from safetensors.torch import load_file

    file = Path(folder) / ADAPTER_WEIGHTS
    if not file.is_file():
        raise FileNotFoundError(f"adapter folder {folder} has no {ADAPTER_WEIGHTS}")
    return load_file(str(file), device="cpu"), adapter_scaling(adapter_config(folder))


def load_served_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> tuple[Any, AdapterBase]:
    """The model an engine serves from folder `path`, in eval mode without gradients, and its `AdapterBase`.

    A full model folder loads as it is; an adapter folder loads its base model with the adapter merged in (the
    base's copy of each touched weight kept aside for the adapters pushed later).
    """
    from transformers import AutoModelForCausalLM

    base = adapter_base(path)
    model = AutoModelForCausalLM.from_pretrained(base or path, dtype=dtype, local_files_only=True)
    model = model.to(device).eval().requires_grad_(False)
    kept = AdapterBase()
    if base is not None:
        adapter, scaling = read_adapter(path)
        with torch.no_grad():
            for name, tensor in kept.merged(model, adapter, scaling).items():
                model.get_parameter(name).copy_(tensor)
    return model, kept
