"""Loading a model to train: `model.dtype` and `model.gradient_checkpointing`, the same for every built-in trainer."""

from __future__ import annotations

from typing import Any

import torch

from agentrl.config.model import LoraConfig, ModelConfig


def train_dtype(model_cfg: ModelConfig) -> torch.dtype:
    """`model.dtype` as a torch dtype. `model_cfg`: the plan's typed `settings.model` (a DictConfig reads the
    same)."""
    return getattr(torch, str(model_cfg.dtype))


def checkpointing(model: Any) -> bool:
    """True when the model recomputes activations in its backward pass (transformers 5.2x calls it activation
    checkpointing, earlier versions gradient checkpointing)."""
    flag = getattr(model, "is_activation_checkpointing", None)
    if flag is None:
        flag = getattr(model, "is_gradient_checkpointing", False)
    return bool(flag)


def prepare_for_training(model: Any, model_cfg: ModelConfig) -> Any:
    """Turn on gradient checkpointing when `model.gradient_checkpointing` asks for it, and note `model.autocast` on
    the model for its training forward; returns the model."""
    if model_cfg.gradient_checkpointing:
        # Non-reentrant checkpointing works with inputs that need no grad and with autocast; no KV cache then.
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    from agentrl.devices import AUTOCAST_ATTRIBUTE

    # Carried by the model, so every forward that trains it (GRPO, SFT, the reference) autocasts the same way.
    setattr(model, AUTOCAST_ATTRIBUTE, str(model_cfg.autocast))
    return model


def lora_settings(model_cfg: ModelConfig) -> LoraConfig | None:
    """The `model.lora` settings when LoRA is on, else None."""
    return model_cfg.lora if model_cfg.lora.enabled else None


def load_trained_model(path: str, model_cfg: ModelConfig, device: Any = "cpu") -> Any:
    """The causal LM at `path` in `model.dtype` on `device`, in eval mode, ready to train (`prepare_for_training`).

    Under `model.lora` it is wrapped with a LoRA adapter (`lora.py`): a fresh one on a full model folder, or,
    for an adapter folder (a LoRA warm start or checkpoint), that adapter on its base, trained further. An adapter
    folder without LoRA is merged into its base and the whole model trained.
    """
    from transformers import AutoModelForCausalLM

    from agentrl.models.lora_folder import adapter_base
    from agentrl.trainers.common import lora

    base = adapter_base(path)
    model = AutoModelForCausalLM.from_pretrained(base or path, dtype=train_dtype(model_cfg)).eval()
    model = prepare_for_training(model, model_cfg)
    settings = lora_settings(model_cfg)
    if base is not None:
        model = lora.with_adapter(model, path, trainable=settings is not None)
    elif settings is not None:
        model = lora.wrap(model, settings)
    return model.eval().to(device)
