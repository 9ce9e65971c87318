"""`model.lora` in the built-in trainers: the trained model wrapped with a PEFT LoRA adapter, and what a push
hands the engine (the adapter's tensors, or the merged weights under `push=merged`).

The base's weights are frozen; the optimizer holds only the adapter's (`trainable_parameters`). docs/models.md,
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
