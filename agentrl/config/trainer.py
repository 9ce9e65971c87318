"""Schemas of the `trainer` group: the backend that updates the model."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class GRPOTrainerConfig(TrainerConfig):
    _target_: str = "agentrl.trainers.grpo.GRPOTrainer"
    prompts_per_step: int = 4  # distinct rows (e.g. days) per step
    samples_per_prompt: int = 8  # rollouts per row: one GRPO group
    temperature: float = 1.1
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_turns: int = 4  # model turns per episode
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2
    kl_coef: float = 0.0  # >0 adds a KL penalty to a frozen reference model
    grad_clip: float = 1.0
    micro_batch_samples: int = 8  # samples per forward/backward pass
    weight_decay: float = 0.0
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class SFTTrainerConfig(TrainerConfig):
    _target_: str = "agentrl.trainers.sft.SFTTrainer"
    steps: int = 1000
    lr: float = 1e-5
    teacher: str = "optimal"  # optimal | greedy: which demonstrations to imitate
    batch_samples: int = 32  # transcripts per optimizer step
    warmup_steps: int = 50
    eval_every: int = 250


@dataclass
class MilesTrainerConfig(TrainerConfig):
    _target_: str = "agentrl.trainers.miles.MilesTrainer"
    prompts_per_step: int = 4  # --rollout-batch-size
    samples_per_prompt: int = 8  # --n-samples-per-prompt
    global_batch_size: int = 32  # must equal prompts_per_step x samples_per_prompt
    temperature: float = 1.1
    max_turns: int = 4
    kl_coef: float = 0.0
    ref_checkpoint: str | None = None  # required when kl_coef > 0
    colocate: bool = True
    gpus_per_node: int = 8
    num_nodes: int = 1
    train_backend: str = "fsdp"  # fsdp | megatron
    tool_call_parser: str = "qwen25"
    save_dir: str | None = None  # null: under the run's output folder
    extra_args: list[str] = field(default_factory=list)  # passed to Miles verbatim
