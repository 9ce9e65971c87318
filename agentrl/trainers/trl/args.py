"""`trainer=trl`'s pure mapping: the plan's typed settings -> TRL's `GRPOConfig` keyword arguments and the launch
command.

Nothing here starts anything; `check_config` is what the plan calls (a setting TRL lacks fails there, named),
`grpo_config_kwargs` what the worker hands to `trl.GRPOConfig`, `launch_command` what `num_processes > 1` runs.
Every function reads typed settings (`Plan.settings`, a `RunConfig`, or its `TRLTrainerConfig`), never a cfg.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config.algorithm import DEFAULT_ADVANTAGE
from agentrl.config.schema import trainer_settings
from agentrl.config.trainer import TRLTrainerConfig

if TYPE_CHECKING:
    from agentrl.config.schema import RunConfig

# Our loss names -> TRL 1.16's (loss_type, importance_sampling_level) (trl/trainer/grpo_trainer.py `_compute_loss`).
# The built-in grpo and dapo losses sum over every model token of the step and divide by their count: TRL's
# "dapo" normalization; gspo's one ratio per sequence is TRL's sequence-level importance sampling.
LOSSES = {"grpo": ("dapo", "token"), "dapo": ("dapo", "token"), "dr_grpo": ("dr_grpo", "token"),
          "gspo": ("grpo", "sequence")}
# Our advantages -> TRL's scale_rewards (both subtract the group mean; group_norm also divides by its std).
ADVANTAGES = {"group_norm": "group", "group_mean": "none"}
WORKER_MODULE = "agentrl.trl_rank"

# Settings of ours that TRL's GRPOTrainer has no counterpart for: the only value accepted, and why.
LACKS: dict[str, tuple[Any, str]] = {
    "max_extra_rows": (0, "TRL's sampler fixes a step's rows before they are played, so it cannot draw "
                          "replacement rows for dropped groups (the built-in GRPO's max_extra_rows)"),
    "max_staleness": (0, "TRL's GRPOTrainer generates a step's completions, then trains on them. TRL's own "
                         "asynchronous trainer (trl.experimental.async_grpo.AsyncGRPOTrainer, its max_staleness) "
                         "generates through its own vLLM server client and rollout worker, not through our session "
                         "and env servers, and only drops stale samples; K > 0 is the built-in GRPO's (trainer=grpo)"),
}
# GRPOConfig fields that agentrl sets itself; extra_args may not override them.
OWNED = ("output_dir", "num_generations", "generation_batch_size", "per_device_train_batch_size",
         "gradient_accumulation_steps", "max_steps", "learning_rate", "temperature", "report_to", "use_vllm",
         "loss_type", "importance_sampling_level", "scale_rewards", "epsilon", "epsilon_high", "beta",
         "lr_scheduler_type", "warmup_steps", "gradient_checkpointing", "activation_checkpointing",
         "model_init_kwargs")
# agent.max_response_tokens=null leaves a reply's length to the session server, whose default_max_tokens this is;
# TRL's bookkeeping (max_completion_length) still needs a number.
SESSION_MAX_TOKENS = 512
# trainer.lr_schedule -> transformers' lr_scheduler_type (with trainer.lr_warmup_steps as warmup_steps).
LR_SCHEDULER_TYPES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


class TRLConfigError(ValueError):
    """A setting `trainer=trl` cannot honour; the message names the key."""


def batch_layout(t: TRLTrainerConfig) -> dict[str, int]:
    """Completions per step and how they split: per process, per micro-batch, accumulation steps."""
    total = t.prompts_per_step * t.samples_per_prompt
    procs = t.num_processes
    if procs < 1:
        raise TRLConfigError(f"trainer.num_processes must be at least 1, not {procs}")
    if total % procs:
        raise TRLConfigError(f"trainer.num_processes={procs} must divide prompts_per_step x samples_per_prompt "
                             f"= {total} (each process plays an equal share of the step's completions)")
    per_proc = total // procs
    micro = min(t.micro_batch_samples, per_proc)
    if micro < 1 or per_proc % micro:
        raise TRLConfigError(f"trainer.micro_batch_samples={t.micro_batch_samples} must divide the "
                             f"{per_proc} completions each of the {procs} processes trains on per step")
    return {"total": total, "per_process": per_proc, "micro": micro, "accumulation": per_proc // micro}


def check_config(settings: RunConfig) -> None:
    """Refuse what TRL lacks or `trainer=trl` cannot run, naming the key (called when the plan is built)."""
    t = trainer_settings(settings, TRLTrainerConfig)
    for key, (accepted, why) in LACKS.items():
        if getattr(t, key) != accepted:
            raise TRLConfigError(f"trainer.{key}={getattr(t, key)} has no counterpart in TRL's GRPOTrainer "
                                 f"(only {accepted} is accepted): {why}")
    if t.samples_per_prompt < 2:
        raise TRLConfigError("trainer.samples_per_prompt must be at least 2: GRPO compares samples within a group")
    if t.loss not in LOSSES:
        raise TRLConfigError(f"trainer.loss={t.loss!r}: TRL runs {', '.join(LOSSES)}")
    if advantage(t) not in ADVANTAGES:
        raise TRLConfigError(f"trainer.advantage={t.advantage} has no counterpart in TRL's GRPOTrainer (it has "
                             f"{', '.join(ADVANTAGES)}; RLOO is a separate TRL trainer)")
    roles = settings.agent.role_list()
    if roles:
        # rollout_func returns exactly one completion per prompt slot; a multi-role play yields several sessions.
        raise TRLConfigError(f"agent: {len(roles)} roles ({', '.join(r.name for r in roles)}) play several "
                             "sessions per episode, but TRL's rollout_func takes one completion per prompt slot; "
                             "trainer=trl runs single-session agents (agent=tool_calling)")
    if not t.drop_no_signal:
        raise TRLConfigError("trainer.drop_no_signal=false has no counterpart in TRL: a group of equal rewards "
                             "always has advantage 0 there")
    batch_layout(t)
    unknown = sorted(set(t.extra_args) - set(grpo_config_fields()))
    if unknown:
        raise TRLConfigError(f"trainer.extra_args: {', '.join(unknown)} are not GRPOConfig fields (TRL 1.16)")
    owned = sorted(set(t.extra_args) & set(OWNED))
    if owned:
        raise TRLConfigError(f"trainer.extra_args: {', '.join(owned)} are set from agentrl's keys; set those")


def advantage(t: TRLTrainerConfig) -> str:
    """`trainer.advantage`, or the loss's own when null (Dr. GRPO drops the std normalization)."""
    return t.advantage or DEFAULT_ADVANTAGE[t.loss]


def grpo_config_fields() -> list[str]:
    """The field names of the installed `trl.GRPOConfig` (empty when TRL is not installed)."""
    import dataclasses

    try:
        from trl import GRPOConfig
    except ImportError:
        return []
    return [f.name for f in dataclasses.fields(GRPOConfig)]


def checkpointing_field() -> str:
    """GRPOConfig's name for gradient checkpointing (transformers 5.2x renamed it activation_checkpointing)."""
    return "activation_checkpointing" if "activation_checkpointing" in grpo_config_fields() else \
        "gradient_checkpointing"


def use_cpu(t: TRLTrainerConfig) -> bool:
    """Train on CPUs: `trainer.device=cpu`, or `auto` on a machine without CUDA."""
    if t.device != "auto":
        return t.device == "cpu"
    import torch

    return not torch.cuda.is_available()


def grpo_config_kwargs(settings: RunConfig, *, output_dir: str | Path, cpu: bool) -> dict[str, Any]:
    """The keyword arguments for `trl.GRPOConfig`: every mapped setting, then `trainer.extra_args`."""
    t, agent, model = trainer_settings(settings, TRLTrainerConfig), settings.agent, settings.model
    layout = batch_layout(t)
    max_turns = agent.max_turns
    per_turn = agent.max_response_tokens or SESSION_MAX_TOKENS
    ckpt = t.checkpoint_every
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": t.steps,
        "learning_rate": t.lr,
        "lr_scheduler_type": LR_SCHEDULER_TYPES[t.lr_schedule],  # as trainer=grpo's (trainers/grpo/lr_schedules.py)
        "warmup_steps": t.lr_warmup_steps,
        "optim": "adamw_torch",
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.grad_clip,
        "num_generations": t.samples_per_prompt,
        "generation_batch_size": layout["total"],
        "per_device_train_batch_size": layout["micro"],
        "gradient_accumulation_steps": layout["accumulation"],
        "num_iterations": 1,  # one update per generation batch: on-policy, as the built-in GRPO
        "temperature": t.temperature,
        "top_p": t.top_p,
        "top_k": t.top_k,
        "epsilon": t.clip_low,
        "epsilon_high": t.clip_high,
        "beta": t.kl_coef,
        "loss_type": LOSSES[t.loss][0],
        "importance_sampling_level": LOSSES[t.loss][1],
        "scale_rewards": ADVANTAGES[advantage(t)],
        # Our agent plays every turn (and stops at agent.max_turns); these two only size TRL's bookkeeping:
        # dr_grpo's normalizer is the longest completion, which holds at most max_turns model replies.
        "max_completion_length": per_turn * max_turns,
        "max_tool_calling_iterations": max_turns,
        "shuffle_dataset": False,  # the dataset is already in the built-in trainer's seeded row order
        "seed": settings.seed,
        "use_cpu": cpu,
        # model.autocast: bf16 mixed precision (accelerate's autocast) on CUDA by default, on a CPU when asked.
        "bf16": model.autocast == "bfloat16" or (model.autocast == "auto" and not cpu),
        # model.dtype (the trained weights') and model.gradient_checkpointing.
        "model_init_kwargs": {"dtype": model.dtype},
        checkpointing_field(): model.gradient_checkpointing,
        "eval_strategy": "no",  # agentrl's evaluator plays the eval split (a callback), as for the other backends
        "save_strategy": "steps" if ckpt > 0 else "no",
        "logging_steps": 1,
        "report_to": [],  # TRL's logs reach MLflow through agentrl's Tracker (a callback), not TRL's MLflow hook
        "use_vllm": False,
        "log_completions": False,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        # Every parameter gets a gradient: DDP's search for unused ones only costs a pass (and warns each step).
        "ddp_find_unused_parameters": False,
        "disable_tqdm": True,
    }
    if ckpt > 0:
        kwargs.update(save_steps=ckpt, save_total_limit=t.keep_checkpoints)
    kwargs.update(t.extra_args)
    return kwargs


def peft_kwargs(settings: RunConfig) -> dict[str, Any] | None:
    """`model.lora` as the keyword arguments of the `peft.LoraConfig` handed to GRPOTrainer's `peft_config`
    (TRL then trains only the adapter), or None for full fine-tuning."""
    lora = settings.model.lora
    if not lora.enabled:
        return None
    return {"task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
            "target_modules": list(lora.target_modules), "bias": "none"}


def peft_config(settings: RunConfig) -> Any:
    """GRPOTrainer's `peft_config`: PEFT's `LoraConfig` for `model.lora`, or None (full fine-tuning)."""
    kwargs = peft_kwargs(settings)
    if kwargs is None:
        return None
    from peft import LoraConfig

    return LoraConfig(**kwargs)


def launch_command(t: TRLTrainerConfig, spec_path: str | Path) -> list[str]:
    """`accelerate launch` for `num_processes` data-parallel workers (CPUs: torchrun-style ranks, gloo)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if t.accelerate_config:
        cmd += ["--config_file", str(t.accelerate_config)]
    else:
        # --multi_gpu only selects the torchrun launcher; with use_cpu accelerate then picks MULTI_CPU + gloo.
        cmd += ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--num_processes", str(t.num_processes), "--main_process_port", str(t.main_process_port),
            "-m", WORKER_MODULE, str(spec_path)]
    return cmd


def report(kwargs: Mapping[str, Any], command: list[str] | None, peft: Mapping[str, Any] | None = None) -> str:
    """The dry run's text: the exact GRPOConfig, the LoRA adapter TRL trains (`peft`), and how it is launched."""
    lines = ["trl: GRPOConfig("]
    lines += [f"    {k}={v!r}," for k, v in kwargs.items()]
    lines.append(")")
    if peft is not None:
        lines.append("peft_config: peft.LoraConfig(" + ", ".join(f"{k}={v!r}" for k, v in peft.items()) + ")")
    if command:
        lines.append("launch: " + shlex.join(command))
    else:
        lines.append(f"launch: in this process (trainer.num_processes=1): {WORKER_MODULE}.train(spec)")
    return "\n".join(lines)
