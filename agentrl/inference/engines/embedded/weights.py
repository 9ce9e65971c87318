"""Reading and checking new weights for `EmbeddedEngine.update_weights`."""

from __future__ import annotations

from pathlib import Path

import torch


def load_state_dict(source: str | Path) -> dict[str, torch.Tensor]:
    """Load a state dict from a Hugging Face folder (safetensors shards or .bin) or a single weights file."""
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {path}")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"weights source {path} does not exist")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(f), device="cpu"))
        else:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def validate_state_dict(
    model: torch.nn.Module, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Check names and shapes against `model`; return the tensors moved to its device and dtype.

    A subset of the keys is allowed (the rest keep their values). Keys that `model` lacks, or a
    shape that differs, raise ValueError so a wrong checkpoint never half-applies.
    """
    own = model.state_dict()
    unknown = sorted(k for k in state if k not in own)
    if unknown:
        raise ValueError(f"update_weights: {len(unknown)} unknown parameter names, e.g. {unknown[:3]}")
    if not state:
        raise ValueError("update_weights: the state dict is empty")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(
                f"update_weights: {name} has shape {tuple(tensor.shape)}, the model expects {tuple(own[name].shape)}"
            )
        # detach + copy now, so later in-place edits by the trainer cannot leak into a pending update
        out[name] = tensor.detach().to(device=device, dtype=dtype, copy=True)
    return out
