"""Schemas of the `trainer` group: the backend that updates the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class TrainerConfig:
    _target_: str = MISSING
    steps: int = 100  # optimizer steps
    lr: float = 1e-6
    eval_every: int = 10  # steps between evaluations (0: only before and after training)
    eval_limit: int | None = None  # eval tasks played (null: the whole eval split)
    checkpoint_every: int = 10  # steps between checkpoints (0: never)
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    resume: bool = False


@dataclass
class WarmStartConfig:
    enabled: bool = True  # run SFT first when no warm-start checkpoint exists
    teacher: str = "optimal"  # optimal | greedy: which demonstrations the warm start imitates
    checkpoint: str | None = None  # an existing SFT checkpoint folder (null: the recipe's own, made on demand)
    # SFT settings of the warm start made on demand (its folder under paths.checkpoint_dir/sft is keyed by them).
    steps: int = 1500  # SFT optimizer steps
    lr: float = 3e-3
    batch_samples: int = 32  # demonstrations per SFT step
    warmup_steps: int = 50
    augment: int = 0  # extra demonstrations per task from the bundle's variants (GridSim: other batteries)
    weight_decay: float = 0.0


@dataclass
class GRPOTrainerConfig(TrainerConfig):
    _target_: str = "agentrl.trainers.grpo.GRPOTrainer"
    prompts_per_step: int = 4  # distinct rows (e.g. days) per step
    samples_per_prompt: int = 8  # rollouts per row: one GRPO group
    temperature: float = 1.1
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2
    kl_coef: float = 0.0  # >0 adds a KL penalty to a frozen reference model
    grad_clip: float = 1.0
    micro_batch_samples: int = 8  # samples per forward/backward pass
    weight_decay: float = 0.0
    max_extra_rows: int = 16  # rows drawn beyond prompts_per_step per step to replace filtered groups
    drop_no_signal: bool = True  # drop groups whose rewards are all equal (zero advantage)
    max_drops_in_a_row: int = 200  # stop the run after more groups in a row were dropped as failed
    checkpoint_path: str | None = None  # null: <paths.checkpoint_dir>/<task_name>/<MLflow run id>
    device: str = "auto"  # cpu | cuda | cuda:N; auto: the embedded engine's device (SGLang: cuda when there)
    threads: int = 0  # torch CPU threads for the GRPO loop (after the warm start); 0: torch's default
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class SFTTrainerConfig(TrainerConfig):
    _target_: str = "agentrl.trainers.sft.SFTTrainer"
    steps: int = 1000
    lr: float = 1e-5
    teacher: str = "optimal"  # optimal | greedy: which demonstrations to imitate
    batch_samples: int = 32  # transcripts per optimizer step
    warmup_steps: int = 50
    augment: int = 0  # extra demonstrations per task from the bundle's variants (GridSim: other batteries)
    weight_decay: float = 0.0
    eval_every: int = 250
    eval_temperature: float = 1.1  # sampled eval; a greedy-decoded eval is reported beside it at the end
    device: str = "auto"  # cpu | cuda | cuda:N; auto: the embedded engine's device
    threads: int = 0  # torch CPU threads in this process; 0: torch's default
    output_dir: str | None = None  # null: <paths.checkpoint_dir>/sft/<bundle>-<teacher>-s<steps>-<settings hash>


@dataclass
class MilesTrainerConfig(TrainerConfig):
    _target_: str = "agentrl.trainers.miles.MilesTrainer"
    prompts_per_step: int = 4  # --rollout-batch-size
    samples_per_prompt: int = 8  # --n-samples-per-prompt
    global_batch_size: int = 32  # must equal prompts_per_step x samples_per_prompt
    temperature: float = 1.1
    top_p: float = 1.0
    max_response_tokens: int = 1024  # per model call (--rollout-max-response-len)
    max_seq_len: int | None = None  # whole trajectory; longer ones are truncated (null: no limit)
    eval_samples_per_prompt: int = 1
    clip_low: float = 0.2  # --eps-clip
    clip_high: float = 0.28  # --eps-clip-high
    kl_coef: float = 0.0  # >0: --use-kl-loss against ref_checkpoint
    kl_loss_type: str = "low_var_kl"
    ref_checkpoint: str | None = None  # required when kl_coef > 0
    weight_decay: float = 0.0
    colocate: bool = True  # training and SGLang share the GPUs (offloading in turn)
    gpus_per_node: int = 8
    num_nodes: int = 1
    rollout_gpus: int | None = None  # not colocated: GPUs for SGLang (null: inference.num_gpus)
    rollout_gpus_per_engine: int = 1  # SGLang tensor parallel size
    tensor_parallel: int = 1  # Megatron tensor parallel size
    max_tokens_per_gpu: int = 9216  # dynamic micro-batching budget
    train_backend: str = "megatron"  # megatron | fsdp (fsdp is disabled in miles-rl 0.0.2)
    megatron_to_hf_mode: str = "bridge"  # bridge: train straight from the HF folder, no conversion
    tool_call_parser: str | None = None  # null: inference.tool_call_parser
    reasoning_parser: str | None = "qwen3"  # SGLang's; null: none
    tito_model: str = "qwen3"  # Miles' token-in/token-out family for the session server
    # Roles an agent may append after a model turn (--tito-allowed-append-roles): tool results, and the user
    # turns of multi-turn tasks and of the thinker/verifier pattern.
    append_roles: list[str] = field(default_factory=lambda: ["tool", "user"])
    chat_template_path: str | None = None  # null: the family's fixed template from miles-tito-tokenizers
    reward_hook: str = "agentrl.trainers.miles_hooks.reward_func"  # --custom-rm-path
    group_filter: str = "agentrl.trainers.miles_hooks.filter_scored_groups"  # --dynamic-sampling-filter-path
    drop_no_signal: bool = True  # the group filter drops groups whose rewards are all equal, as GRPO does
    max_drops_in_a_row: int = 1000  # the group filter stops the run after more dropped groups in a row
    # The agent Miles plays (behind agentrl.trainers.miles_hooks.agent_function, which keeps its result).
    agent_function: str = "agentrl.agents.tool_calling.run"
    save_dir: str | None = None  # null: under the run's output folder
    extra_args: list[str] = field(default_factory=list)  # passed to Miles verbatim, last


@dataclass
class TRLTrainerConfig(TrainerConfig):
    """TRL's GRPOTrainer playing our agent through its `rollout_func` (docs/trl.md); same keys as `grpo` where
    TRL has the setting. A key TRL lacks keeps a neutral default, and another value fails when the plan is built."""

    _target_: str = "agentrl.trainers.trl.TRLTrainer"
    prompts_per_step: int = 4  # rows per step; GRPOConfig.generation_batch_size = prompts x samples
    samples_per_prompt: int = 8  # GRPOConfig.num_generations
    temperature: float = 1.1
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    clip_low: float = 0.2  # GRPOConfig.epsilon
    clip_high: float = 0.2  # GRPOConfig.epsilon_high
    kl_coef: float = 0.0  # GRPOConfig.beta (TRL keeps its own frozen reference model when > 0)
    loss: str = "grpo"  # grpo | dapo | dr_grpo | gspo, as the built-in GRPO names them (mapped to TRL's loss_type)
    advantage: str | None = None  # group_norm | group_mean (null: the loss's own); rloo has no TRL counterpart
    grad_clip: float = 1.0  # GRPOConfig.max_grad_norm
    micro_batch_samples: int = 8  # GRPOConfig.per_device_train_batch_size; accumulation makes up the rest
    weight_decay: float = 0.0
    # The built-in GRPO redraws rows for dropped groups; TRL's sampler cannot, so only 0 is accepted.
    max_extra_rows: int = 0
    drop_no_signal: bool = True  # groups of equal rewards train nothing (TRL: advantage 0 in them anyway)
    num_processes: int = 1  # >1: `accelerate launch` with that many data-parallel processes (gloo on CPUs)
    accelerate_config: str | None = None  # an accelerate/DeepSpeed config file for GPUs and nodes (docs/trl.md)
    main_process_port: int = 0  # accelerate's rendezvous port; 0 picks a free one
    checkpoint_path: str | None = None  # null: <paths.checkpoint_dir>/<task_name>/<MLflow run id> (TRL's output_dir)
    device: str = "auto"  # cpu | cuda; auto: cuda when there (accelerate places each process)
    threads: int = 0  # torch CPU threads per process (after the warm start); 0: torch's default
    extra_args: dict[str, Any] = field(default_factory=dict)  # more GRPOConfig fields, verbatim (names checked)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
