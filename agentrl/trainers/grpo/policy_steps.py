"""How a trained policy learns: its `Learner`, each step's advantages, update and weight push, per policy.

The policies themselves (who plays what: `main`, a role's own model, an endpoint) are `play/policies.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.config.model import LoraConfig, ModelConfig
from agentrl.config.schema import RunConfig, trainer_settings
from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.inference.engines.protocol import engine_class, option_engines
from agentrl.play.policies import MAIN, Policy
from agentrl.trainers.grpo.learner import STEP_METRICS, Algorithm, Learner, TrainItem


def partial_rollouts_problem(settings: RunConfig) -> str | None:
    """`trainer.partial_rollouts` needs an engine that applies a push to running replies
    (`Engine.KEEPS_RUNNING_ON_PUSH`: the embedded one, or vLLM), and under `model.lora.push=adapter` one that
    applies an adapter push to them too (`KEEPS_RUNNING_ON_ADAPTER_PUSH`: vLLM's running reply keeps the adapter it
    was admitted with)."""
    if not trainer_settings(settings, GRPOTrainerConfig).partial_rollouts:
        return None
    target = str(settings.inference._target_)
    try:
        engine = engine_class(target)
    except (ImportError, AttributeError, TypeError) as exc:
        return f"trainer.partial_rollouts=true: what inference._target_={target} can do is unknown: {exc}"
    if not engine.KEEPS_RUNNING_ON_PUSH:
        keepers = " or ".join(f"inference={name}" for name, e in option_engines().items() if e.KEEPS_RUNNING_ON_PUSH)
        return (f"trainer.partial_rollouts=true needs {keepers} (engines that apply a push to running replies); "
                f"{target} waits for them: set trainer.partial_rollouts=false")
    lora = settings.model.lora
    if lora.enabled and lora.push == "adapter" and not engine.KEEPS_RUNNING_ON_ADAPTER_PUSH:
        option = next((f"inference={name}" for name, e in option_engines().items() if e is engine),
                      f"inference._target_={target}")
        return (f"trainer.partial_rollouts=true with {option} cannot push an adapter into "
                f"running replies ({engine.__name__} keeps the one a reply was admitted with): set "
                f"model.lora.push=merged, or trainer.partial_rollouts=false")
    return None


def make_learner(t: GRPOTrainerConfig, model: Any, tokenizer: Any, lora: LoraConfig | None = None) -> Learner:
    """A `Learner` for `model` with the trainer config `t`'s optimizer and algorithm (loss, advantage, KL, ...);
    `lora`: the `model.lora` settings when `model` carries a LoRA adapter."""
    return Learner(model, lr=float(t.lr), weight_decay=float(t.weight_decay), grad_clip=float(t.grad_clip),
                   algorithm=Algorithm.from_config(t), temperature=float(t.temperature),
                   micro_batch_samples=int(t.micro_batch_samples), pad_id=tokenizer.pad_token_id or 0,
                   steps=int(t.steps), lr_warmup_steps=int(t.lr_warmup_steps),
                   lr_schedule=str(t.lr_schedule), epochs=int(t.epochs), mini_batches=int(t.mini_batches),
                   lora=lora, push_mode="keep" if t.partial_rollouts else "wait")


def load_learners(t: GRPOTrainerConfig, policies: Sequence[Policy], device: Any = "cpu", *,
                  model_cfg: ModelConfig) -> None:
    """Load every trainable policy's model and tokenizer from its `path` onto `device` (in `model_cfg`'s dtype,
    with its gradient checkpointing: `trained_model.py`); give it a learner. Under `model.lora` each trained policy
    gets an adapter of its own; a frozen one gets none (it is never loaded to train)."""
    from transformers import AutoTokenizer

    from agentrl.trainers.common.trained_model import load_trained_model, lora_settings

    for p in policies:
        if p.trainable:
            p.tokenizer = AutoTokenizer.from_pretrained(p.path)
            p.learner = make_learner(t, load_trained_model(p.path, model_cfg, device), p.tokenizer,
                                     lora=lora_settings(model_cfg))


# An update's metrics when a policy had nothing to train on (no group passed the filter): zeros, not gaps.
_EMPTY_STEP = dict.fromkeys(STEP_METRICS, 0.0)


def metric_prefix(policy: Policy) -> str:
    """`train/` for the shared policy, `train/<name>/` for a role's own model."""
    return "train/" if policy.name == MAIN else f"train/{policy.name}/"


def advantages(policies: Sequence[Policy], played: Sequence[Any]) -> list[tuple[Policy, list[TrainItem]]]:
    """Each trainable policy's samples of `played` with their advantages (the learner's advantage kind and reward
    shaping), computed over all of `played`: every role counts in its group whichever model played it."""
    return [(p, p.learner.items(played, policy=p.name)[0]) for p in policies if p.learner is not None]


def update_policies(batches: Sequence[tuple[Policy, list[TrainItem]]], step: int | None = None) -> dict[str, float]:
    """Each policy's update (`Learner.step`: `trainer.epochs` x `mini_batches` optimizer steps) on its own samples; the metrics under `metric_prefix(policy)`.

    With `step` (1-based), each learner first takes that step's learning rate (`Learner.at_step`, logged as
    `lr`). A policy without samples (every group dropped) logs zeros and `updates` 0 (trainers/common/no_update.py).
    """
    metrics: dict[str, float] = {}
    for p, items in batches:
        out = dict(_EMPTY_STEP)
        if step is not None:
            out["lr"] = p.learner.at_step(step)
        out.update({k.removeprefix("train/"): v for k, v in p.learner.step(items).items()})
        out["updates"] = 1.0 if items else 0.0
        metrics.update({f"{metric_prefix(p)}{k}": v for k, v in out.items()})
    return metrics


def push_policies(batches: Sequence[tuple[Policy, list[TrainItem]]], engines: Mapping[str, Any]) -> float:
    """Each updated policy's weights to its own engine; returns the seconds spent."""
    return sum(p.learner.push(engines[p.name]) for p, items in batches if items)


def step_policies(policies: Sequence[Policy], played: Sequence[Any], engines: Mapping[str, Any],
                  step: int | None = None) -> tuple[dict[str, float], float]:
    """`advantages`, `update_policies` and `push_policies` in one call: the metrics and the push seconds."""
    batches = advantages(policies, played)
    metrics = update_policies(batches, step)
    return metrics, push_policies(batches, engines)
