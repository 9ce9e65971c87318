"""One `trainer=trl` process: TRL's `GRPOTrainer` whose `rollout_func` plays our agent through our services.

Every process (one, or each accelerate rank) starts its own engine + session server + env server on the
start folder (`services.py`), so generation is our embedded engine (transformers) and a rollout is the same
`RolloutRunner` play as under `trainer=grpo`: the agent's tool loop, the env server, the reward group. Before a
step's plays the engine gets TRL's current weights (as TRL syncs vLLM). A play's recorded session becomes
TRL's (prompt_ids, completion_ids, logprobs, env_mask): the first turn's prompt, then everything after it with
mask 1 on model tokens and 0 on tool/user tokens; its reward reaches TRL through a reward function that
returns it. Each step is reported as a `StepStats` (`steps.py`), as the built-in GRPO step is. Rank 0 runs
agentrl's evaluator and sends every metric to a sink (the Tracker, or a JSON Lines file the parent forwards).
`accelerate launch` starts `agentrl.trl_rank`, which builds the plan and calls `train`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.agents.record import Rollout
from agentrl.config.inference import EmbeddedInferenceConfig
from agentrl.config.schema import RunConfig, trainer_settings
from agentrl.config.trainer import TRLTrainerConfig
from agentrl.console import TRL_SILENCE
from agentrl.devices import set_threads
from agentrl.group_filter import FAILED, group_drop_reason
from agentrl.interrupts import between_steps
from agentrl.play.episode_traces import TraceAs
from agentrl.play.eval_results import EvalSink
from agentrl.play.evaluate import trainer_eval
from agentrl.play.rollout import make_row
from agentrl.play.services import start_services
from agentrl.trainers.common.resume import TRANSFORMERS, checkpoint_step, resumed_history, write_record
from agentrl.trainers.common.step_fill import RowStream
from agentrl.trainers.common.step_products import StepStats
from agentrl.trainers.common.weight_push import push
from agentrl.trainers.trl.args import grpo_config_kwargs, peft_config, use_cpu
from agentrl.trainers.trl.steps import PlayedStep, gather_step, make_callback

log = logging.getLogger(__name__)
Sink = Callable[[dict[str, float], int], None]
LOST_FILE = "trl_dependency_lost.txt"  # a rank that lost the env server or its engine says which, here
TRACES_PREFIX = "trl_traces_"  # each accelerate rank's episode traces: trl_traces_<pid>.jsonl in the run folder
INDEX_KEY = "agentrl_index"  # carried in every prompt message: rollout_func receives only the prompts


def train_dataset(settings: RunConfig, bundle: Any) -> Any:
    """The step's rows in the built-in trainer's seeded order (`RowStream`), `steps x prompts_per_step` of them.
    `settings` is the plan's typed config (`Plan.settings`)."""
    from datasets import Dataset

    split, t = settings.env.train_split, trainer_settings(settings, TRLTrainerConfig)
    stream = RowStream(bundle.splits()[split], settings.seed)
    rows = []
    for _ in range(t.steps * t.prompts_per_step):
        index = stream.next()
        messages = make_row(bundle, split, index, "", {})["messages"]
        rows.append({"prompt": [{**m, INDEX_KEY: index} for m in messages]})
    return Dataset.from_list(rows)


def agentrl_reward(prompts: list[Any], completions: list[Any], reward: list[float], **_: Any) -> list[float]:
    """The reward our reward group gave each play (rollout_func's `reward` field)."""
    return [float(r) for r in reward]


def train_plan(groups: list[list[Rollout]], *, drop_no_signal: bool,
               penalize: bool) -> tuple[list[str | None], set[int]]:
    """Each group's drop reason (None: kept), and the ids of the rollouts whose tokens train nothing: every one of a
    group dropped as failed. TRL's sampler cannot redraw a dropped row, so such a group stays in TRL's batch masked
    out. With `penalize` (`trainer.model_failures=penalize`), a play cut or out of turns by the policy's own doing
    stays trained at reward 0 in its group, as under the built-in trainer."""
    reasons = [group_drop_reason(g, drop_no_signal=drop_no_signal, penalize_model_failures=penalize) for g in groups]
    masked = {id(r) for g in groups
              if group_drop_reason(g, drop_no_signal=False, penalize_model_failures=penalize) == FAILED for r in g}
    return reasons, masked


class Bridge:
    """The rollout function TRL calls, the weight sync, the evaluator and the metrics of a step."""

    def __init__(self, plan: Any, services: Any, tokenizer: Any, sink: Sink | None, run_dir: str = "") -> None:
        self.plan, self.services, self.tokenizer, self.sink = plan, services, tokenizer, sink
        # Per-task eval files (evals/eval-step-<n>.jsonl) as trainer=grpo writes them; logged to the tracker when
        # this process has one (one process), else by the parent after the workers end (`TRLTrainer._launch`).
        self.eval_sink = EvalSink(plan.tracker, Path(run_dir or plan.run_dir))
        self.settings: RunConfig = plan.settings
        self.t = trainer_settings(self.settings, TRLTrainerConfig)
        self.synced_step = 0  # the engine holds the start folder, which is TRL's step-0 model
        self.calls = 0
        self.played: PlayedStep | None = None  # the last rollout_func call's plays, over every rank
        self.stats: StepStats | None = None  # the last step's report (steps.make_callback makes it)
        self.history: dict[str, list[tuple[int, float]]] = {"train/reward": [], "eval/reward": []}
        self.times: defaultdict[str, float] = defaultdict(float)  # wall seconds: train, eval

    # --------------------------------------------------------------- weights

    def sync(self, trainer: Any) -> float:
        """Copy TRL's current weights into this process's engine once per optimizer step; returns the seconds."""
        if trainer.state.global_step == self.synced_step:
            return 0.0
        started = time.monotonic()
        model = trainer.accelerator.unwrap_model(trainer.model)
        # Under model.lora (TRL's peft_config) the adapter alone, or the merged weights with push=merged.
        push(model, self.services.engine, self.settings.model.lora)
        self.synced_step = trainer.state.global_step
        return time.monotonic() - started

    # --------------------------------------------------------------- rollouts

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's `rollout_func`: one play of our agent per prompt slot, in slot order."""
        push_s = self.sync(trainer)
        started = time.monotonic()
        rank, step = trainer.accelerator.process_index, trainer.state.global_step + 1
        slots = [int(p[0][INDEX_KEY]) for p in prompts]
        counts = Counter(slots)  # a row's slots on this process (its group may be split across processes)
        svc, split = self.services, self.settings.env.train_split
        rows = [make_row(self.plan.bundle, split, i, svc.env_url, svc.env_settings) for i in counts]
        self.calls += 1
        # Under the run's breaker (services.py): a dead env server or engine stops the run within
        # trainer.dependency_grace_s, naming it, or is waited for (trainer.on_dependency_loss).
        groups = asyncio.run(svc.runner.play_rows(rows, list(counts.values()),
                                                  request_kwargs=self.plan.sampling.request_kwargs(),
                                                  seed_parts=(self.settings.seed, step, rank, self.calls),
                                                  trace_as=TraceAs("train", step)))
        if svc.runner.breaker is not None:
            svc.runner.breaker.step_done(step, [r for g in groups for r in g])
        queues = {i: list(g) for i, g in zip(counts, groups, strict=True)}
        reasons, masked = train_plan(groups, drop_no_signal=self.t.drop_no_signal,
                                     penalize=self.t.model_failures == "penalize")
        out: dict[str, list[Any]] = defaultdict(list)
        for index in slots:
            rollout = queues[index].pop(0)
            for key, value in self._completion(rollout, train=id(rollout) not in masked).items():
                out[key].append(value)
        # row_cursor: by this step's end TRL's sampler has handed out step x prompts_per_step rows of train_dataset.
        self.played = gather_step(step, groups, reasons, trained_tokens=sum(map(sum, out["env_mask"])),
                                  push_s=push_s, generate_s=time.monotonic() - started,
                                  played_from=svc.engine.weight_version, row_cursor=step * self.t.prompts_per_step,
                                  breakdown=self.plan.bundle.train_breakdown)
        return dict(out)

    def _completion(self, rollout: Rollout, *, train: bool) -> dict[str, Any]:
        """A play's sample as TRL's fields; a failed group's samples train nothing (mask 0), as if dropped."""
        sample = rollout.sample
        if sample is None or not sample.token_ids:
            # Nothing was recorded (the play failed before the model's first turn): TRL needs a non-empty
            # completion, so the prompt as the template renders it and one end token, masked out, reward 0.
            row = rollout.row
            prompt = list(self.tokenizer.apply_chat_template(
                row["messages"], tools=row["metadata"].get("tools"), add_generation_prompt=True, tokenize=True,
                return_dict=False, enable_thinking=False))
            return {"prompt_ids": prompt, "completion_ids": [self.tokenizer.eos_token_id], "logprobs": [0.0],
                    "env_mask": [0], "reward": float(rollout.reward)}
        cut = sample.prompt_length
        mask = [int(m) if train else 0 for m in sample.loss_mask[cut:]]
        return {"prompt_ids": list(sample.token_ids[:cut]), "completion_ids": list(sample.token_ids[cut:]),
                "logprobs": [float(x) for x in sample.rollout_logprobs[cut:]], "env_mask": mask,
                "reward": float(rollout.reward)}

    # --------------------------------------------------------------- eval

    def evaluate(self, trainer: Any | None, step: int, *, greedy: bool = False) -> dict[str, float]:
        """agentrl's evaluator on the eval split with TRL's current weights (rank 0 only)."""
        if trainer is not None:
            self.sync(trainer)
        return trainer_eval(self.services, self.plan.bundle, self.settings, step, sampling=self.plan.sampling,
                            greedy=greedy, times=self.times, history=self.history, sink=self.eval_sink)


def weight_digest(model: torch.nn.Module) -> dict[str, list[float]]:
    """Per-tensor (sum, sum of squares) of a model's weights: what two ranks compare after training."""
    return {k: [float(v.double().sum()), float(v.double().pow(2).sum())] for k, v in model.state_dict().items()}


def record_callback(record: dict[str, Any], bridge: Bridge) -> Any:
    """A TrainerCallback that writes the run's record into each checkpoint TRL saves (what a resume checks), with
    the reward curves' points so far (a resumed run's plot starts from them)."""
    from transformers import TrainerCallback

    class RecordCallback(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and folder.is_dir():
                write_record(folder, {**record, "history": bridge.history}, state.global_step)

    return RecordCallback()


def trained_model(settings: RunConfig, start_path: str) -> tuple[Any, Any]:
    """GRPOTrainer's `model` and `peft_config`: the start folder and `model.lora`'s adapter config. A LoRA warm
    start's adapter folder is loaded as its base with that adapter: trained further under `model.lora` (TRL takes
    the PeftModel), else merged in and the whole model trained, as `trained_model.load_trained_model` does."""
    from agentrl.models.lora_folder import adapter_base

    base = adapter_base(start_path)
    if base is None:
        return start_path, peft_config(settings)
    from transformers import AutoModelForCausalLM

    from agentrl.trainers.common.lora import with_adapter
    from agentrl.trainers.common.trained_model import train_dtype

    model = AutoModelForCausalLM.from_pretrained(base, dtype=train_dtype(settings.model), local_files_only=True)
    return with_adapter(model, start_path, trainable=settings.model.lora.enabled), None


def train(plan: Any, *, start_path: str, output_dir: str, run_dir: str, sink: Sink | None,
          resume_from: str | None = None, record: dict[str, Any] | None = None, traces: Any = None) -> dict[str, Any]:
    """Train with TRL from `start_path`; rank 0 returns the final metrics (every rank writes its weight digest).
    Everything comes from `plan`: its objects, its typed settings, its engine factory.

    `traces`: where this process's episode traces go (`Tracker.log_traces`); the plan's tracker when None (one
    process), a `TraceFile` the parent forwards under accelerate.

    `resume_from`: a TRL checkpoint folder to continue (TRL's `resume_from_checkpoint`: weights, optimizer,
    scheduler, RNG and step); `record`: the run's record, written into every checkpoint.
    """
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    settings: RunConfig = plan.settings
    t = trainer_settings(settings, TRLTrainerConfig)
    torch.manual_seed(settings.seed)
    threads = set_threads(settings)
    cpu = use_cpu(t)
    args = GRPOConfig(**grpo_config_kwargs(settings, output_dir=output_dir, cpu=cpu))
    rank = args.process_index
    if rank != 0:  # TRL's experimental-API notice: rank 0 shows it once, not every process
        os.environ[TRL_SILENCE] = "1"
    log.info("TRL: process %d of %d, %d torch threads, cpu=%s", rank, args.world_size, threads, cpu)
    # Only the embedded engine's schema has a device (vLLM and SGLang place their own servers).
    on_cuda = isinstance(settings.inference, EmbeddedInferenceConfig) and settings.inference.device.startswith("cuda")
    if on_cuda and args.world_size > 1:  # each rank's engine beside its own learner
        plan = dataclasses.replace(plan, engine_factory=plan.engine_factory.on_device(
            f"cuda:{args.local_process_index}"))
    tokenizer = AutoTokenizer.from_pretrained(start_path, local_files_only=True)
    tokenizer.padding_side = "left"
    services = start_services(plan, start_path)
    # Episode traces: every eval play and a sample of training's, as under trainer=grpo.
    services.runner.traces = traces if traces is not None else plan.tracker
    bridge = Bridge(plan, services, tokenizer, sink if rank == 0 else None, run_dir)
    if resume_from:  # the points so far, so the next checkpoint's record holds the whole curve
        bridge.history = resumed_history(Path(resume_from), checkpoint_step(Path(resume_from), TRANSFORMERS) or 0,
                                         list(bridge.history))
    final: dict[str, Any] = {}
    try:
        trainer_ref: list[Any] = []
        model, peft = trained_model(settings, start_path)
        trainer = GRPOTrainer(model=model, reward_funcs=[agentrl_reward], args=args, peft_config=peft,
                              train_dataset=train_dataset(settings, plan.bundle), processing_class=tokenizer,
                              callbacks=[make_callback(bridge, trainer_ref),
                                         *([record_callback(record, bridge)] if record else [])], rollout_func=bridge)
        trainer_ref.append(trainer)
        # With disable_tqdm TRL prints every logged dict raw; our callback logs them (MLflow) and the eval lines.
        trainer.remove_callback(PrinterCallback)
        if rank == 0 and sink is not None and not resume_from:
            sink(bridge.evaluate(None, 0), 0)  # the start folder, before any step (as trainer=grpo)
        with between_steps():  # Ctrl-C and SIGTERM stop it at a step's start (the callback's stop point)
            trainer.train(resume_from_checkpoint=resume_from)
        model = trainer.accelerator.unwrap_model(trainer.model)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / f"trl_rank{rank}_weights.json").write_text(json.dumps(weight_digest(model)))
        if trainer.accelerator.is_main_process:
            steps = t.steps
            greedy = bridge.evaluate(trainer, steps, greedy=True)
            if sink is not None:
                sink(greedy, steps)
            final = {**(bridge.stats.as_metrics() if bridge.stats is not None else {}), **greedy}
            if bridge.history["eval/reward"]:
                final["eval/reward"] = bridge.history["eval/reward"][-1][1]
            final["time/engine_start_total_s"] = services.start_s
            final["time/train_total_s"] = bridge.times["train"]
            final["time/eval_total_s"] = bridge.times["eval"]
            folder = Path(run_dir) / "final_model"
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            final["history"] = bridge.history
        trainer.accelerator.wait_for_everyone()
    finally:
        services.close()
    return final
