"""Schemas of the `trainer` group: the backend that updates the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II, MISSING

from agentrl.config.algorithm import check_algorithm, is_set, miles_algorithm_problem
from agentrl.config.numbers import (
    check_counts,
    check_finite,
    check_ports,
    check_rl_numbers,
    check_trainer_numbers,
)
from agentrl.config.sampling import Sampling
from agentrl.config.staleness import check_retired_overlap, check_staleness

# The rollouts' and the sampled evals' temperature unless a recipe says otherwise (GRPO, TRL, Miles; SFT's eval).
TEMPERATURE = 1.1


@dataclass
class TrainerConfig:
    _target_: str = MISSING
    steps: int = 100  # optimizer steps
    lr: float = 1e-6
    eval_every: int = 10  # steps between evaluations (0: only before and after training)
    eval_limit: int | None = None  # eval tasks played, stratified as the bundle declares (null: the whole split)
    checkpoint_every: int = 10  # steps between checkpoints (0: never)
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    # latest (this task's newest checkpoint; true is its old spelling) | an MLflow run id | a checkpoint folder;
    # null/false: start fresh. Checked against the checkpoint's config when the plan is built (docs/training.md).
    resume: str | None = None
    resume_force: bool = False  # resume even when model/env/agent/reward/trainer differ (the run is tagged)

    def sampling(self) -> Sampling | None:
        """How this trainer's rollouts and sampled evals sample (`Plan.sampling`); None: it samples nothing."""
        return None


@dataclass
class SFTDemonstrationsConfig:
    """What an SFT imitates and how it batches it: the keys `trainer=sft` and the warm start (`trainer.warm_start`)
    share; each keeps its own `steps` and `lr`."""

    teacher: str = "optimal"  # optimal | greedy: which demonstrations to imitate
    batch_samples: int = 32  # demonstrations per SFT step
    warmup_steps: int = 50
    augment: int = 0  # extra demonstrations per task from the bundle's variants (GridSim: other batteries)
    generated: int = 0  # extra demonstrations of tasks the bundle generates (GridSim: fresh train-date days)
    weight_decay: float = 0.0


@dataclass
class WarmStartConfig(SFTDemonstrationsConfig):
    # Run SFT first when no warm-start checkpoint exists. null: on for a model made from scratch (model=tiny),
    # off for a pretrained one (an SFT at the warm start's rates would wreck it): the plan decides and says so.
    enabled: bool | None = None
    checkpoint: str | None = None  # an existing SFT checkpoint folder (null: the recipe's own, made on demand)
    # SFT settings of the warm start made on demand (its folder under paths.checkpoint_dir/sft is keyed by them,
    # and by the demonstrations' keys).
    steps: int = 1500  # SFT optimizer steps
    lr: float = 3e-3
    # Play the warm start made in this run on the eval split (warm_start/eval/*). The trainer's step-0 eval plays
    # the same weights on the same tasks, so false saves one eval (on GridSim's 200 days, minutes) and loses
    # nothing but the second figure.
    eval: bool = True

    def __post_init__(self) -> None:
        check_sft_numbers("trainer.warm_start", self)


def check_sft_numbers(prefix: str, c: Any) -> None:
    """An SFT's keys (the warm start's, `trainer=sft`'s): steps, batch, warmup, extra demonstrations, rates."""
    check_counts(prefix, c, ("steps", "batch_samples"))
    check_counts(prefix, c, ("warmup_steps", "augment", "generated"), minimum=0)
    check_finite(prefix, c, ("lr",), positive=True)
    check_finite(prefix, c, ("weight_decay",))


@dataclass
class WarmStartSettings:
    """The trainers that start from an SFT warm start (grpo, trl) carry `trainer.warm_start`."""

    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class DependencyWatchConfig:
    """The circuit breaker on the env server and the engine (docs/training.md, "When a dependency dies"); the
    trainers that play rollouts through our services (grpo, trl) carry these keys."""

    # Seconds of play with the env server or the engine in trouble (plays failing against it, or its /health not
    # answering) and no play succeeding before the breaker trips.
    dependency_grace_s: float = 50.0
    # Trip sooner: this many plays in a row failed the same way against one dependency and its /health answers
    # an error (it says it cannot serve; a silent one may be restarting: the grace window judges that).
    max_dependency_failures: int = 16
    on_dependency_loss: str = "stop"  # stop: end the run naming it | wait: wait for its /health, replay what it cut
    warn_failure_share: float = 0.5  # warn on the console when a step flags at least this share of its rollouts

    def __post_init__(self) -> None:
        if self.on_dependency_loss not in ("stop", "wait"):
            raise ValueError(f"trainer.on_dependency_loss must be stop or wait, got {self.on_dependency_loss!r}")
        if float(self.dependency_grace_s) <= 0:
            raise ValueError(f"trainer.dependency_grace_s must be > 0 seconds, got {self.dependency_grace_s}")
        if int(self.max_dependency_failures) < 1:
            raise ValueError(f"trainer.max_dependency_failures must be >= 1, got {self.max_dependency_failures}")
        if not 0 < float(self.warn_failure_share) <= 1:
            raise ValueError(f"trainer.warn_failure_share must be in (0, 1], got {self.warn_failure_share}")


LR_SCHEDULES = ("constant", "linear", "cosine")  # agentrl/trainers/grpo/lr_schedules.py; TRL: trainers/trl/args.py


def check_lr_schedule(schedule: str, warmup_steps: int, key: str = "trainer") -> None:
    """ValueError naming the key for an unknown schedule or a negative warmup (the schema's check, and the
    learner's: `lr_schedules.lr_factor`)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"{key}.lr_schedule={schedule!r}: choose one of {', '.join(LR_SCHEDULES)}")
    if int(warmup_steps) < 0:
        raise ValueError(f"{key}.lr_warmup_steps must be >= 0 (0: no warmup), got {warmup_steps}")


@dataclass
class ModelFailuresConfig:
    # A rollout truncated, over budget or out of turns (the policy's own doing): drop its group, or penalize:
    # keep it in the group at reward 0 (docs/training.md, "Failed rollouts"). Env and engine failures always drop.
    model_failures: str = "drop"  # drop | penalize

    def __post_init__(self) -> None:
        if self.model_failures not in ("drop", "penalize"):
            raise ValueError(f"trainer.model_failures must be drop or penalize, got {self.model_failures!r}")


@dataclass
class LRScheduleConfig:
    """The RL stage's learning-rate schedule (docs/models.md, "Learning rate"); the grpo and trl trainers carry it."""

    lr_warmup_steps: int = 0  # steps of linear warmup from lr/warmup to lr (0: none)
    lr_schedule: str = "constant"  # constant | linear | cosine: the rate after the warmup, to 0 past the last step

    def check_lr_schedule(self) -> None:
        check_lr_schedule(self.lr_schedule, self.lr_warmup_steps)


@dataclass
class GRPOTrainerConfig(WarmStartSettings, ModelFailuresConfig, LRScheduleConfig, DependencyWatchConfig,
                        TrainerConfig):
    _target_: str = "agentrl.trainers.grpo.GRPOTrainer"
    prompts_per_step: int = 4  # distinct rows (e.g. days) per step
    samples_per_prompt: int = 8  # rollouts per row: one GRPO group
    temperature: float = TEMPERATURE
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    # The algorithm (docs/training.md "Algorithms"), checked when the plan is built.
    loss: str = "grpo"  # grpo | dr_grpo | dapo | gspo
    # group_norm | group_mean | rloo | per_role | rae | hierarchical; null: the loss's own (dr_grpo: group_mean)
    advantage: str | None = None
    rae_decay: float = 0.95  # advantage=rae: the per-role EMA baseline's weight on its past (SPIRAL's 0.95)
    # advantage=hierarchical: roles compared only within one play (the same proposed problem); others per group
    episode_roles: list[str] = field(default_factory=lambda: ["solver"])
    clip_low: float | None = None  # ratio clipped to [1 - clip_low, 1 + clip_high]; null: the loss's own
    clip_high: float | None = None  # null: grpo, dr_grpo 0.2; dapo 0.28 (clip-higher); gspo 3e-4 / 4e-4
    kl_coef: float = 0.0  # >0 adds a KL penalty to a frozen copy of the starting model (logged as train/kl)
    kl_estimator: str = "k3"  # k1 | k3: the per-token KL estimate
    entropy_coef: float = 0.0  # >0 adds an entropy bonus (train/entropy is logged either way)
    tis_cap: float = 2.0  # truncated importance sampling against the engine's logprobs, weights cut at this; 0: off
    # truncate: weights above tis_cap are cut to it | mask: tokens (or samples) above tis_cap leave the loss |
    # ignore: no correction at all (the ratio to the learner's own start, weight 1: stale samples train as on-policy)
    tis_mode: str = "truncate"
    tis_level: str = "token"  # token: one weight per token | sequence: one per sample (its tokens' geometric mean)
    norm_tokens: int = 512  # dr_grpo: the loss is divided by samples x norm_tokens, a constant
    # dapo's soft overlong penalty on a sample's longest reply: 0 up to max - buffer tokens, then down to -1 at max.
    overlong_max_tokens: int | None = II("agent.max_response_tokens")  # null: no penalty
    overlong_buffer: int | None = None  # null: a fifth of overlong_max_tokens
    grad_clip: float = 1.0
    micro_batch_samples: int = 8  # samples per forward/backward pass
    # Optimizer steps per batch: `epochs` passes over the step's samples, each cut into `mini_batches` updates
    # (PPO epochs; TRL's num_iterations, verl's ppo_epochs). 1 and 1: one update, the ratio stays at 1 under TIS.
    epochs: int = 1
    mini_batches: int = 1
    weight_decay: float = 0.0
    max_extra_rows: int = 16  # rows drawn beyond prompts_per_step per step to replace filtered groups
    drop_no_signal: bool = True  # drop groups whose rewards are all equal (zero advantage)
    # K: a sample may be trained up to K weight versions after the one that sampled its first token. 0: play, then
    # train; 1: play step n+1 while step n trains (corrected by the ratio to the engine's logprobs and tis_cap; a
    # step costs about max(play, train) instead of their sum: benchmarks/RESULTS.md, "`trainer.off_policy_steps`");
    # K >= 2: play up to K steps ahead (docs/training.md, "Overlapped rollouts" and "Staleness")
    max_staleness: int = 1
    # What keeps samples within K (play_ahead.py): wait (generation stops until the learner catches up), pace
    # (rows admitted one step per step trained), drop (generation never waits; groups older than K are dropped)
    stale_policy: str = "wait"
    # Partial rollouts: a push lands between two decode steps and running replies go on under the new weights (each
    # token records its version; inference=embedded or vllm). false: a push waits for the running replies to finish.
    partial_rollouts: bool = False
    off_policy_steps: int | None = None  # retired: renamed max_staleness (set, it fails naming the new key)
    max_drops_in_a_row: int = 200  # stop the run after more groups in a row were dropped as failed
    checkpoint_path: str | None = None  # null: <paths.checkpoint_dir>/<task_name>/<MLflow run id>
    device: str = "auto"  # cpu | cuda | cuda:N; auto: the embedded engine's device (SGLang: cuda when there)
    threads: int = 0  # torch CPU threads for the GRPO loop (after the warm start); 0: torch's default

    def __post_init__(self) -> None:
        check_rl_numbers(self, counts=("max_drops_in_a_row",), zero_ok=("max_extra_rows",))
        check_algorithm(self)
        for name in ("epochs", "mini_batches"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"trainer.{name} must be >= 1 (1: one optimizer step per batch), "
                                 f"got {getattr(self, name)}")
        if not 0 <= float(self.rae_decay) < 1:
            raise ValueError(f"trainer.rae_decay must be in [0, 1) (the baseline's weight on its past), "
                             f"got {self.rae_decay}")
        DependencyWatchConfig.__post_init__(self)
        self.check_lr_schedule()
        ModelFailuresConfig.__post_init__(self)
        check_staleness(self)
        if int(self.norm_tokens) < 1:
            raise ValueError(f"trainer.norm_tokens must be >= 1 (dr_grpo's constant normalizer), got {self.norm_tokens}")
        if is_set(self.overlong_buffer):
            if self.loss != "dapo":
                raise ValueError(f"trainer.overlong_buffer applies only to trainer.loss=dapo (loss is {self.loss})")
            cap = self.overlong_max_tokens
            if int(self.overlong_buffer) < 1 or (is_set(cap) and int(self.overlong_buffer) > int(cap)):
                raise ValueError(f"trainer.overlong_buffer must be in [1, overlong_max_tokens={cap}], "
                                 f"got {self.overlong_buffer}")
        if is_set(self.overlong_max_tokens) and int(self.overlong_max_tokens) < 1:
            raise ValueError(f"trainer.overlong_max_tokens must be >= 1 (or null: no penalty), "
                             f"got {self.overlong_max_tokens}")

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k)


@dataclass
class SFTTrainerConfig(SFTDemonstrationsConfig, TrainerConfig):
    _target_: str = "agentrl.trainers.sft.SFTTrainer"
    steps: int = 1000
    lr: float = 1e-5
    eval_every: int = 250
    eval_temperature: float = TEMPERATURE  # sampled eval; a greedy-decoded eval is reported beside it at the end
    device: str = "auto"  # cpu | cuda | cuda:N; auto: the embedded engine's device
    threads: int = 0  # torch CPU threads in this process; 0: torch's default
    output_dir: str | None = None  # null: <paths.checkpoint_dir>/sft/<bundle>-<teacher>-s<steps>-<settings hash>

    def __post_init__(self) -> None:
        check_trainer_numbers(self)
        check_sft_numbers("trainer", self)
        check_counts("trainer", self, ("threads",), minimum=0)

    def sampling(self) -> Sampling:
        return Sampling(self.eval_temperature, top_p=1.0, top_k=0)  # SFT's evals filter nothing


@dataclass
class MilesTrainerConfig(TrainerConfig):
    _target_: str = "agentrl.trainers.miles.MilesTrainer"
    prompts_per_step: int = 4  # --rollout-batch-size
    samples_per_prompt: int = 8  # --n-samples-per-prompt
    global_batch_size: int = 32  # must equal prompts_per_step x samples_per_prompt
    temperature: float = TEMPERATURE
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
    reward_hook: str = "agentrl.trainers.miles.hooks.reward_func"  # --custom-rm-path
    group_filter: str = "agentrl.trainers.miles.hooks.filter_scored_groups"  # --dynamic-sampling-filter-path
    drop_no_signal: bool = True  # the group filter drops groups whose rewards are all equal, as GRPO does
    max_drops_in_a_row: int = 1000  # the group filter stops the run after more dropped groups in a row
    # The agent Miles plays (behind agentrl.trainers.miles.hooks.agent_function, which keeps its result).
    agent_function: str = "agentrl.agents.tool_calling.run"
    save_dir: str | None = None  # null: under the run's output folder
    extra_args: list[str] = field(default_factory=list)  # passed to Miles verbatim, last
    # The built-in GRPO's algorithm keys, so that one sweep can name them under either trainer. Miles runs its
    # own GRPO: any other value fails when the plan is built, naming the Miles flag to pass in extra_args.
    loss: str = "grpo"  # only grpo (Miles' --advantage-estimator grpo)
    advantage: str | None = None  # null or group_norm only
    kl_estimator: str | None = None  # null only: Miles' estimator is kl_loss_type
    entropy_coef: float = 0.0  # 0 only: --entropy-coef in extra_args
    tis_cap: float = 0.0  # 0 only: --use-tis --tis-clip in extra_args
    max_staleness: int = 0  # 0 only: this launch runs Miles' synchronous loop (miles_algorithm_problem says why)

    def __post_init__(self) -> None:
        check_trainer_numbers(self)
        check_counts("trainer", self, ("prompts_per_step", "samples_per_prompt", "global_batch_size",
                                       "max_response_tokens", "eval_samples_per_prompt", "gpus_per_node", "num_nodes",
                                       "rollout_gpus_per_engine", "tensor_parallel", "max_tokens_per_gpu",
                                       "max_drops_in_a_row"))
        check_finite("trainer", self, ("weight_decay",))
        if problem := miles_algorithm_problem(self):
            raise ValueError(problem)

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, top_k=0)  # Miles' launch sets no top-k


@dataclass
class TRLTrainerConfig(WarmStartSettings, ModelFailuresConfig, LRScheduleConfig, DependencyWatchConfig,
                       TrainerConfig):
    """TRL's GRPOTrainer playing our agent through its `rollout_func` (docs/trl.md); same keys as `grpo` where
    TRL has the setting. A key TRL lacks keeps a neutral default, and another value fails when the plan is built."""

    _target_: str = "agentrl.trainers.trl.TRLTrainer"
    prompts_per_step: int = 4  # rows per step; GRPOConfig.generation_batch_size = prompts x samples
    samples_per_prompt: int = 8  # GRPOConfig.num_generations
    temperature: float = TEMPERATURE
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
    max_staleness: int = 0  # 0 only: TRL's GRPOTrainer generates, then trains (trainers/trl/args.py says why, and what not)
    off_policy_steps: int | None = None  # retired: renamed max_staleness (set, it fails naming the new key)
    drop_no_signal: bool = True  # groups of equal rewards train nothing (TRL: advantage 0 in them anyway)
    num_processes: int = 1  # >1: `accelerate launch` with that many data-parallel processes (gloo on CPUs)
    accelerate_config: str | None = None  # an accelerate/DeepSpeed config file for GPUs and nodes (docs/trl.md)
    main_process_port: int = 0  # accelerate's rendezvous port; 0 picks a free one
    checkpoint_path: str | None = None  # null: <paths.checkpoint_dir>/<task_name>/<MLflow run id> (TRL's output_dir)
    device: str = "auto"  # cpu | cuda; auto: cuda when there (accelerate places each process)
    threads: int = 0  # torch CPU threads per process (after the warm start); 0: torch's default
    extra_args: dict[str, Any] = field(default_factory=dict)  # more GRPOConfig fields, verbatim (names checked)

    def __post_init__(self) -> None:
        check_rl_numbers(self, counts=("num_processes",))
        check_ports("trainer", self, ("main_process_port",))
        check_retired_overlap(self)
        DependencyWatchConfig.__post_init__(self)
        ModelFailuresConfig.__post_init__(self)
        self.check_lr_schedule()

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k)
