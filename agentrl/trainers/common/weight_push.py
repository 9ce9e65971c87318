"""The weight push: what the trained model hands the engine after an update (`push`).

A full model pushes its state dict (`engine.update_weights`). Under `model.lora` with `push=adapter` only the
adapter's tensors go (`engine.update_adapter`, with the adapter's settings); with `push=merged` the merged weights
(W + s * B @ A under the base's names) go as a full model's would. A head tied to the input embedding is sent
once. The LoRA wrapping itself is `lora.py`; docs/models.md, "LoRA".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from agentrl.trainers.common.lora import ADAPTER, is_lora

if TYPE_CHECKING:
    # `model.lora`'s schema, named apart from PEFT's own LoraConfig
    from agentrl.config.model import LoraConfig as LoraSettings


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (`get_peft_model_state_dict`), detached."""
    from peft import get_peft_model_state_dict

    return {k: v.detach() for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()}


def merged_state(model: Any) -> dict[str, torch.Tensor]:
    """The whole model's weights under the base's names, each LoRA layer's as W + s * B @ A: what an engine
    without adapter support loads (`model.lora.push=merged`). The model itself is left as it is."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, tensor in base.state_dict().items():
            if ".lora_" not in name:
                out[name.replace(".base_layer.", ".")] = tensor.detach()
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
                weight = module.get_base_layer().weight
                # each LoraLayer subclass (Linear, Embedding, Conv) has get_delta_weight; the base has not
                delta = module.get_delta_weight(ADAPTER)  # type: ignore[attr-defined]
                out[f"{name}.weight"] = (weight + delta.to(weight.dtype)).detach()
    return out


def without_tied_head(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without the output head when the model ties it to the input embedding: the engine's copy is the
    same model, tied too, so the embedding carries both (SmolLM2's head was 113 MB of a 651 MB push)."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embedding is None or head.weight is not embedding.weight:
        return state
    names = [k for k, v in state.items() if v.data_ptr() == head.weight.data_ptr()]
    keep = next((k for k in names if "embed" in k), names[0] if names else None)
    return {k: v for k, v in state.items() if k not in names or k == keep}


def tensor_bytes(state: dict[str, torch.Tensor]) -> int:
    """The bytes a state dict's tensors hold (what a push sends)."""
    return sum(t.numel() * t.element_size() for t in state.values())


def push(model: Any, engine: Any, lora: LoraSettings | None, **kw: Any) -> int:
    """Hand `model`'s weights to `engine` (`kw`: the engine call's options); returns the bytes handed over.

    Under LoRA with `push=adapter` only the adapter goes (`engine.update_adapter`); with `push=merged` the merged
    weights; a full model's state dict otherwise (`engine.update_weights`)."""
    if not is_lora(model):
        state = without_tied_head(model, {k: v.detach() for k, v in model.state_dict().items()})
        engine.update_weights(state, **kw)
        return tensor_bytes(state)
    if lora is not None and lora.push == "merged":
        state = without_tied_head(model.get_base_model(), merged_state(model))
        engine.update_weights(state, **kw)
        return tensor_bytes(state)
    # Every engine of ours takes adapters (engines/protocol.py); an engine of the user's own may not.
    update = getattr(engine, "update_adapter", None)
    if update is None:
        raise TypeError(f"{type(engine).__name__} does not take LoRA adapters; set model.lora.push=merged to push "
                        "the merged weights instead")
    state = adapter_state(model)
    update(state, adapter_settings(model), **kw)
    return tensor_bytes(state)


def adapter_settings(model: Any) -> LoraSettings:
    """`model`'s adapter as `model.lora` settings (rank, alpha, dropout, target modules): what an engine needs to
    apply it. Read from the adapter itself, which a warm start or checkpoint may have made with other settings."""
    from agentrl.config.model import LoraConfig

    c = model.peft_config[ADAPTER]
    return LoraConfig(enabled=True, rank=int(c.r), alpha=float(c.lora_alpha), dropout=float(c.lora_dropout),
                      target_modules=sorted(c.target_modules))
