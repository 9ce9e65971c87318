"""`trainer=sft`: supervised fine-tuning on a bundle's demonstrations (the GRPO warm start).

Each train task's demonstration (system, user, the teacher's tool call, the tool's answer) is rendered by
the model's chat template; the loss is the mean cross-entropy over the assistant's tokens only (the
template's generation blocks). A multi-agent pattern's run trains on its own role turns instead (the agent's
`demonstrations`, `agents/demos.py`), cached in a folder of its own. The teacher is one the bundle offers
(`Bundle.teachers`). Evaluation plays real episodes of the eval split through the same engine, session server
and env server that GRPO uses. The result is a Hugging Face folder (model + tokenizer) written whole or not at
all (`fsutil.atomic_dir`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agentrl.config.schema import RunConfig, trainer_settings
from agentrl.config.trainer import SFTTrainerConfig, WarmStartConfig
from agentrl.console import progress
from agentrl.devices import model_device, set_threads, train_device
from agentrl.fsutil import atomic_dir
from agentrl.interrupts import between_steps, stop_point
from agentrl.play.eval_results import EvalSink
from agentrl.play.evaluate import evaluate
from agentrl.trainers.common.forward import first_loss_column, next_token_logits
from agentrl.trainers.common.lora import trainable_parameters
from agentrl.trainers.common.protocol import TrainerBase
from agentrl.trainers.sft.demonstrations import demonstration_data, role_demonstrations
from agentrl.trainers.sft.state import clear_state, fingerprint, load_state, save_state, state_dir

log = logging.getLogger(__name__)

# The settings of an SFT run: `trainer` (trainer=sft) and `trainer.warm_start` (GRPO's warm start) both hold them.
SFT_SETTINGS = ("teacher", "steps", "lr", "batch_samples", "warmup_steps", "augment", "weight_decay")
SFTSettings = SFTTrainerConfig | WarmStartConfig
# Bump when a code change alters the demonstrations a warm start trains on (a teacher, a prompt, a role's
# demonstration, their tokenization): the cache key holds settings, not code, so without it every cached warm
# start made by the old code would be reused as if current. 0 adds nothing: folders cached before it keep their names.
DEMONSTRATIONS_VERSION = 0


def data_key(bundle: Any) -> str:
    """The bundle's data options (`Bundle.data_options`) as one key part: their values joined by `|`.

    A bundle without any gives "None", and one option its bare value: the key read `env.prompt_style` before
    bundles declared their options, so warm starts cached then keep their folder names.
    """
    options = bundle.data_options()
    return "|".join(map(str, options.values())) if options else "None"


def model_key(run: RunConfig) -> str:
    """The base model as the SFT cache key names it: a folder under `paths.model_dir` (the locally built tiny
    model, whose name holds its build settings) by that name, so a home that is moved or copied keeps its warm
    starts; any other folder by its path, as given."""
    try:
        return Path(run.model.path).resolve().relative_to(Path(run.paths.model_dir).resolve()).as_posix()
    except ValueError:
        return str(run.model.path)


def sft_checkpoint_path(run: RunConfig, settings: SFTSettings, bundle: Any, agent: Any = None, *,
                        legacy: bool = False) -> Path:
    """Where the SFT result for these settings lives: reused by every run that asks for the same warm start.

    The key holds the bundle, its data options, the train split, the base model (`model_key`), the seed,
    `SFT_SETTINGS`, `DEMONSTRATIONS_VERSION` and `generated` when set, and, for an agent that makes role
    demonstrations, its pattern and `demonstration_options()` (the folder name then says the pattern): two
    patterns never share a warm start.
    `run` is the plan's typed settings; `bundle` and `agent` are the plan's (no agent: a run without one).
    `legacy`: the folder the key made before it named a model under `paths.model_dir` by its folder name (the
    absolute path then), where warm starts made before that still sit.
    """
    env = run.env
    model = str(run.model.path) if legacy else model_key(run)
    parts = [env.bundle, data_key(bundle), env.train_split, model, run.seed, *(getattr(settings, k) for k in SFT_SETTINGS)]
    if DEMONSTRATIONS_VERSION:
        parts.append(f"demonstrations=v{DEMONSTRATIONS_VERSION}")
    if settings.generated:  # a later setting: keys without it keep the folder names cached before it
        parts.append(f"generated={settings.generated}")
    if run.model.dtype != "float32":  # likewise: float32 folders keep their names
        parts.append(f"dtype={run.model.dtype}")
    if run.model.lora.enabled:  # a LoRA warm start is an adapter folder: never the full one's (what it trains)
        lora = run.model.lora
        parts.append(f"lora={lora.rank},{lora.alpha},{lora.dropout},{','.join(lora.target_modules)}")
    label = Path(str(env.bundle)).name
    if role_demonstrations(agent):
        # Only role-aware warm starts get the extra part: the tool-calling agent's folders keep their names.
        options = agent.demonstration_options()
        parts.append(json.dumps(options, sort_keys=True))
        label += f"-{options['pattern']}"
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:10]
    return Path(run.paths.checkpoint_dir) / "sft" / f"{label}-{settings.teacher}-s{settings.steps}-{digest}"


def lr_schedule(optimizer: torch.optim.Optimizer, steps: int, warmup: int) -> Any:
    """Linear warmup to the full rate over `warmup` steps, then cosine decay to 0.1 of it at the last step.

    transformers' schedule starts at step 0 with rate 0 (a step that only moves AdamW's moments); starting it
    one step in keeps the first step at 1/warmup of the rate, as SFT has always trained.
    """
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])  # what a scheduler that starts past step 0 reads
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=steps,
                                                       min_lr_rate=0.1, last_epoch=0)


def sft_batch(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, attention mask, targets): targets[:, t] is token t + 1, or -100 off the assistant."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (seq, mask) in enumerate(batch):
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        labels[i, :len(seq)] = torch.tensor([t if m else -100 for t, m in zip(seq, mask, strict=True)])
    return ids, attn, labels[:, 1:]


def sft_loss(model: Any, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean next-token cross-entropy over assistant tokens of a right-padded batch, on the model's device."""
    device = model_device(model)
    ids, attn, targets = (t.to(device, non_blocking=True) for t in sft_batch(batch, pad_id))
    first = first_loss_column(targets != -100)  # the prompt before it needs no logits
    logits = next_token_logits(model, ids, attn, first).float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[:, first:].reshape(-1),
                                             ignore_index=-100)


def save_hf_folder(model: Any, tokenizer: Any, target: Path) -> Path:
    """Write model + tokenizer as a Hugging Face folder at `target`, replacing it whole (never half-written)."""
    target = Path(target)
    try:
        with atomic_dir(target) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            for extra in ("agentrl_tiny.json",):  # keep the tiny model's build record next to its weights
                src = Path(getattr(model, "name_or_path", "")) / extra
                if src.is_file():
                    shutil.copy(src, tmp / extra)
    except OSError as exc:
        raise OSError(f"could not save the model to {target}: {exc} (is the disk full?)") from exc
    return target


def train_sft(model: Any, tokenizer: Any, data: Sequence[tuple[list[int], list[int]]], *, steps: int, lr: float,
              batch_samples: int, warmup_steps: int, seed: int, on_step: Callable[[int, float], None] | None = None,
              on_eval: Callable[[int], None] | None = None, eval_every: int = 0,
              weight_decay: float = 0.0, state: Path | None = None) -> float:
    """AdamW over `steps` batches drawn (seeded) from `data`; returns the last loss. With a `state` folder, a
    Ctrl-C or SIGTERM between steps saves the run there and a later call with the same settings and data
    continues it (`state.py`)."""
    if not data:
        raise ValueError("SFT has no demonstrations to train on")
    rng = random.Random(seed)
    params = trainable_parameters(model)  # under LoRA, the adapter's only
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    sched = lr_schedule(opt, steps, warmup_steps)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    start, key = 0, ""
    if state is not None:
        key = fingerprint(model, data, {"steps": steps, "lr": lr, "batch_samples": batch_samples, "seed": seed,
                                        "warmup_steps": warmup_steps, "weight_decay": weight_decay})
        start = load_state(state, key=key, steps=steps, model=model, optimizer=opt, scheduler=sched, rng=rng)
        if start:
            print(f"SFT: continuing a stopped run from step {start}/{steps} (its state: {state})", flush=True)

    def stop_here(done: int) -> None:
        """Stop here if a signal came; keep the state of the `done` finished steps first."""
        try:
            stop_point()
        except KeyboardInterrupt:
            if state is not None and done > 0:
                try:
                    save_state(state, step=done, key=key, model=model, optimizer=opt, scheduler=sched, rng=rng)
                    print(f"\nSFT stopped after step {done}/{steps}; its state is in {state}: the same command "
                          "continues it", flush=True)
                except OSError as exc:
                    print(f"\nSFT stopped after step {done}/{steps}; its state could not be saved to {state}: "
                          f"{exc} (is the disk full?)", flush=True)
            raise

    model.train()
    loss_value = float("nan")
    with between_steps():  # Ctrl-C and SIGTERM stop it between steps (agentrl/interrupts.py)
        for step in range(start, steps):
            stop_here(step)
            batch = [data[rng.randrange(len(data))] for _ in range(batch_samples)]
            loss = sft_loss(model, batch, pad)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            loss_value = float(loss.detach())
            if on_step:
                on_step(step + 1, loss_value)
            if on_eval and eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
                model.eval()
                on_eval(step + 1)
                model.train()
        stop_here(steps)  # a signal during the last step: the finished run is kept as a state too
    model.eval()
    return loss_value


class SFTTrainer(TrainerBase):
    """Fine-tunes the run's model on the bundle's demonstrations and saves a Hugging Face folder."""

    def __init__(self, *, plan: Any, tracker: Any) -> None:
        self.plan, self.tracker = plan, tracker
        run: RunConfig = plan.settings
        t = trainer_settings(run, SFTTrainerConfig)
        self.output_dir = Path(t.output_dir) if t.output_dir else \
            sft_checkpoint_path(run, t, plan.bundle, plan.agent)

    def fit(self) -> dict[str, float]:
        """Train, then play the eval split sampled and greedy-decoded; returns the metrics, among them
        `eval/reward`, `eval_greedy/reward`, `time/train_total_s` and `time/eval_total_s`."""
        from agentrl.play.services import start_services

        plan = self.plan
        run: RunConfig = plan.settings
        t = trainer_settings(run, SFTTrainerConfig)
        set_threads(run)
        metrics = run_sft(plan, self.output_dir, t, eval_every=t.eval_every, tracker=self.tracker)
        started = time.monotonic()
        services = start_services(plan, str(self.output_dir))  # roles with their own model play it
        services.runner.traces = self.tracker  # every eval play is traced, as under GRPO
        sink = EvalSink(self.tracker, Path(plan.run_dir))  # evals/eval-step-<n>.jsonl, as GRPO's
        try:
            final, _ = evaluate(services, plan.bundle, run.env.eval_split, limit=t.eval_limit,
                                sampling=plan.sampling, seed_parts=(run.seed, "final"), step=t.steps, sink=sink)
            greedy, _ = evaluate(services, plan.bundle, run.env.eval_split, limit=t.eval_limit,
                                 sampling=plan.sampling.greedy_copy(), prefix="eval_greedy", step=t.steps, sink=sink)
        finally:
            services.close()
        final.update(greedy)
        final["time/engine_start_total_s"] = services.start_s
        final["time/eval_total_s"] = metrics.pop("time/eval_total_s") + time.monotonic() - started - services.start_s
        final["time/train_total_s"] = metrics["time/train_total_s"]
        self.tracker.log(final, step=t.steps)
        self.tracker.set_tags({"agentrl.checkpoint": str(self.output_dir)})
        self.tracker.log_model(self.output_dir)
        metrics.update(final)
        log.info("SFT done: %s", {k: round(v, 4) for k, v in final.items()})
        print(f"SFT model saved to {self.output_dir}; eval/reward {final.get('eval/reward', float('nan')):.4f} "
              f"(greedy {final.get('eval_greedy/reward', float('nan')):.4f})", flush=True)
        return metrics


def run_sft(plan: Any, output_dir: Path, settings: SFTSettings, *, eval_every: int = 0, tracker: Any = None,
            step_offset: int = 0, prefix: str = "") -> dict[str, float]:
    """Make the plan's base model, train it on the demonstrations `settings` (`SFT_SETTINGS`) name, save it to
    `output_dir`; returns `sft/loss` (the last), `sft/train_s` (wall seconds), and the split of them into
    `time/train_total_s` and `time/eval_total_s` (the evaluations during training).

    With a tracker, the loss is logged every 10 steps and (when `eval_every` > 0) `eval/*` from played
    episodes every `eval_every` steps (their per-task files `evals/eval-step-<n>.jsonl`, their plays traced): as
    `sft/loss` and `eval/*`, or with a `prefix` as `<prefix>/loss` and `<prefix>/eval/*` (GRPO's warm start
    logs under `warm_start` in the GRPO run).
    """
    from transformers import AutoTokenizer

    from agentrl.play.services import start_services
    from agentrl.trainers.common.trained_model import load_trained_model

    run: RunConfig = plan.settings
    torch.manual_seed(run.seed)
    base_path = plan.model.path()  # the plan's model source: made here the first time (the tiny model)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    device = train_device(run)
    model = load_trained_model(base_path, run.model, device)  # model.dtype, model.gradient_checkpointing
    teacher, steps = settings.teacher, settings.steps
    started = time.monotonic()
    agent = plan.agent
    data = demonstration_data(tokenizer, plan.bundle, run.env.train_split, teacher, augment=settings.augment,
                              seed=run.seed, agent=agent, generated=settings.generated)
    kind = f"{type(agent).__name__} role" if role_demonstrations(agent) else "single-agent"
    log.info("SFT on %d %s %s demonstrations of %s for %d steps on %s", len(data), kind, teacher,
             plan.bundle.name, steps, device)
    last = {"loss": float("nan"), "eval_s": 0.0}
    loss_key = f"{prefix}/loss" if prefix else "sft/loss"
    bar = tqdm(total=steps, desc=f"SFT ({teacher})", unit="step", mininterval=5.0, dynamic_ncols=True)

    def on_step(step: int, loss: float) -> None:
        last["loss"] = loss
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        bar.update(step - bar.n)  # a continued run starts past 0
        if step % max(1, steps // 10) == 0 or step == steps:  # the log file's progress: ten lines a run
            progress(f"SFT step {step}/{steps}: loss {loss:.4f}")
        if tracker is not None and (step % 10 == 0 or step == steps):
            tracker.log({loss_key: loss}, step=step_offset + step)

    def on_eval(step: int) -> None:
        if tracker is None:
            return
        eval_started = time.monotonic()
        # not the output folder: a run stopped after this eval would leave a half-trained model under the name
        # every later warm start with these settings reuses as finished
        save_hf_folder(model, tokenizer, eval_dir)
        services = start_services(plan, str(eval_dir))
        services.runner.traces = tracker
        try:
            m, _ = evaluate(services, plan.bundle, run.env.eval_split, limit=run.trainer.eval_limit,
                            sampling=plan.sampling, seed_parts=(run.seed, step), prefix=f"{prefix}/eval" if prefix
                            else "eval", step=step, sink=EvalSink(tracker, Path(plan.run_dir)))
        finally:
            services.close()
        tracker.log(m, step=step_offset + step)
        last["eval_s"] += time.monotonic() - eval_started

    eval_dir = Path(output_dir).with_name(f"{Path(output_dir).name}.eval")
    state = state_dir(output_dir)
    try:
        train_sft(model, tokenizer, data, steps=steps, lr=settings.lr, batch_samples=settings.batch_samples,
                  warmup_steps=settings.warmup_steps, weight_decay=settings.weight_decay, seed=run.seed,
                  on_step=on_step, on_eval=on_eval, eval_every=eval_every, state=state)
    finally:
        bar.close()
        shutil.rmtree(eval_dir, ignore_errors=True)
    save_hf_folder(model, tokenizer, output_dir)
    clear_state(state)
    wall = time.monotonic() - started
    return {"sft/loss": last["loss"], "sft/train_s": wall, "time/train_total_s": wall - last["eval_s"],
            "time/eval_total_s": last["eval_s"]}
