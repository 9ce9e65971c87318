"""`model.lora` in the built-in trainers: the trained model wrapped with a PEFT LoRA adapter (a fresh one, or one
read from an adapter folder), its settings checked against the model, and the plan's line about it.

The base's weights are frozen; the optimizer holds only the adapter's (`trainable_parameters`). What a push hands
the engine (the adapter's tensors, or the merged weights under `push=merged`) is `weight_push.py`. docs/models.md,
"LoRA".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    # `model.lora`'s schema, named apart from PEFT's own LoraConfig
    from agentrl.config.model import LoraConfig as LoraSettings

ADAPTER = "default"  # PEFT's name for a model's one adapter


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers (what `target_modules` may name), sorted."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and name})


def target_problem(model: torch.nn.Module, targets: Iterable[str]) -> str | None:
    """Why `model.lora.target_modules` cannot be applied to `model` (a name it lacks), or None when it can."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}
    missing = [t for t in targets if t not in names]
    if not missing:
        return None
    return (f"model.lora.target_modules: the model has no module {', '.join(map(repr, missing))}; its linear "
            f"layers are {', '.join(linear_names(model))}")


def peft_config(lora: LoraSettings) -> Any:
    """PEFT's `LoraConfig` for the `model.lora` settings (a causal LM; no bias, no extra trained modules)."""
    from peft import LoraConfig, TaskType

    # PEFT annotates lora_alpha as int; a float works (its scaling is alpha / rank), and the schema's alpha is
    # one.
    return LoraConfig(task_type=TaskType.CAUSAL_LM, r=int(lora.rank),
                      lora_alpha=float(lora.alpha),  # type: ignore[arg-type]
                      lora_dropout=float(lora.dropout), target_modules=list(lora.target_modules), bias="none")


def wrap(model: torch.nn.Module, lora: LoraSettings) -> Any:
    """`model` with a fresh LoRA adapter (B = 0: it starts as the base); the base's weights frozen.

    Raises ValueError naming a target module the model does not have."""
    from peft import get_peft_model

    if problem := target_problem(model, lora.target_modules):
        raise ValueError(problem)
    return get_peft_model(model, peft_config(lora))


def with_adapter(model: torch.nn.Module, folder: str, *, trainable: bool) -> Any:
    """`model` (the base) with the adapter saved in `folder`: trained further when `trainable`, else merged in
    (a full model again: full fine-tuning that starts from a LoRA warm start)."""
    from peft import PeftModel

    wrapped = PeftModel.from_pretrained(model, folder, is_trainable=trainable)
    return wrapped if trainable else wrapped.merge_and_unload()


def is_lora(model: Any) -> bool:
    """True for a model wrapped with a PEFT adapter."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should hold: all of a full model's, only the adapter's under LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    return sum(p.numel() for p in trainable_parameters(model)), sum(p.numel() for p in model.parameters())


def skeleton(path: str) -> torch.nn.Module:
    """The model at folder `path` (an adapter folder: its base) built on the meta device: its modules and
    parameter shapes, no weights loaded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.models.lora_folder import adapter_base

    config = AutoConfig.from_pretrained(adapter_base(path) or path, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def plan_note(path: str, lora: LoraSettings) -> str:
    """The plan's line about `model.lora` on the model at `path`: its settings and how many parameters train.

    Raises ValueError naming a target module the model does not have (and the ones it has)."""
    model = skeleton(path)
    if problem := target_problem(model, lora.target_modules):
        raise ValueError(problem)
    wrapped = wrap(model, lora)
    trained, total = parameter_counts(wrapped)
    return (f"LoRA rank {lora.rank}, alpha {lora.alpha:g}, dropout {lora.dropout:g} on "
            f"{', '.join(lora.target_modules)}: {trained:,} of {total:,} parameters trained "
            f"({100 * trained / total:.2f}%); push={lora.push}")
