"""The models a GRPO run plays: the shared policy `main` and one policy per distinct role `model`.

A role with `model: null` plays the shared policy. A role whose `model` is a local Hugging Face folder plays
that model, on its own engine and session server; roles naming the same folder share it. Such a policy is
trained (its own `Learner`, its own AdamW) unless every role playing it is `frozen`; it is then played but
never updated. A `model` that is an `http(s)://` URL is an external OpenAI-compatible endpoint (its base URL,
without `/v1`): played, never recorded, never trained. Every sample updates only the policy that played it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.trainers.learner import STEP_METRICS, Algorithm, Learner, TrainItem

MAIN = "main"


def is_endpoint(model: str) -> bool:
    """True for an external OpenAI-compatible endpoint (an http(s) URL) rather than a model folder."""
    return model.startswith(("http://", "https://"))


@dataclass
class Policy:
    """A model the run plays: where it comes from, who plays it, and (when trained) its learner."""

    name: str
    source: str  # where it starts: the run's start folder (main), a role's model folder or endpoint URL
    roles: list[str] = field(default_factory=list)
    trainable: bool = False
    path: str = ""  # where its weights load from now: `source`, or the resumed checkpoint's copy
    tokenizer: Any = None
    learner: Learner | None = None

    @property
    def external(self) -> bool:
        return is_endpoint(self.source)


def _get(entry: Any, key: str, default: Any = None) -> Any:
    return entry.get(key, default) if hasattr(entry, "get") else getattr(entry, key, default)


def plan_policies(roles: Iterable[Any] | None) -> list[Policy]:
    """One `Policy` per distinct role `model` (in order of first use); roles without a model play `main`.

    Raises FileNotFoundError for a model that is neither an existing folder nor an http(s) URL.
    """
    by_source: dict[str, Policy] = {}
    for role in roles or []:
        model, name = _get(role, "model"), str(_get(role, "name"))
        if not model:
            continue
        model = str(model).rstrip("/")
        if is_endpoint(model):
            model = model.removesuffix("/v1")  # the agent appends /v1/chat/completions itself
        elif not Path(model).is_dir():
            raise FileNotFoundError(f"role {name!r}: model {model!r} is neither a model folder nor an http(s):// "
                                    "URL of an OpenAI-compatible endpoint")
        policy = by_source.get(model)
        if policy is None:
            # Named after the first role that plays it; `main` is the shared policy's name.
            policy = by_source[model] = Policy(name if name != MAIN else f"role_{name}", model, path=model)
        policy.roles.append(name)
        if not _get(role, "frozen", False) and not is_endpoint(model):
            policy.trainable = True
    return list(by_source.values())


def routing(policies: Sequence[Policy], servers: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The runner's maps: `routes` (role -> session server), `external` (role -> endpoint), `role_policy`.

    `servers` holds the session server URL of every policy that is not external.
    """
    routes, external, role_policy = {}, {}, {}
    for p in policies:
        for role in p.roles:
            role_policy[role] = p.name
            if p.external:
                external[role] = p.source
            else:
                routes[role] = servers[p.name]
    return {"routes": routes, "external": external, "role_policy": role_policy}


def untrained_roles(policies: Sequence[Policy]) -> list[str]:
    """Roles whose policy is never updated (all its roles frozen, or an external endpoint)."""
    return [r for p in policies if not p.trainable for r in p.roles]


def main_policy(path: str) -> Policy:
    """The shared policy, starting from `path`: played by every role without a model of its own, always trained."""
    return Policy(MAIN, path, trainable=True, path=path)


def partial_rollouts_problem(settings: Any) -> str | None:
    """`trainer.partial_rollouts` needs an engine that applies a push to running replies: the embedded one, or vLLM
    for full weights (a running reply keeps the LoRA adapter it was admitted with)."""
    if not settings.trainer.partial_rollouts:
        return None
    target = str(settings.inference._target_)
    if target.startswith("agentrl.inference.engine"):
        return None
    if target == "agentrl.inference.vllm.VLLMEngine":
        lora = settings.model.lora
        if lora.enabled and lora.push == "adapter":
            return ("trainer.partial_rollouts=true with inference=vllm cannot push an adapter into running replies "
                    "(vLLM keeps the one a reply was admitted with): set model.lora.push=merged, or "
                    "trainer.partial_rollouts=false")
        return None
    return (f"trainer.partial_rollouts=true needs inference=embedded or inference=vllm (engines that apply a push "
            f"to running replies); {target} waits for them: set trainer.partial_rollouts=false")


def make_learner(t: Any, model: Any, tokenizer: Any, lora: Any = None) -> Learner:
    """A `Learner` for `model` with the trainer config `t`'s optimizer and algorithm (loss, advantage, KL, ...);
    `lora`: the `model.lora` settings when `model` carries a LoRA adapter."""
    return Learner(model, lr=float(t.lr), weight_decay=float(t.weight_decay), grad_clip=float(t.grad_clip),
                   algorithm=Algorithm.from_config(t), temperature=float(t.temperature),
                   micro_batch_samples=int(t.micro_batch_samples), pad_id=tokenizer.pad_token_id or 0,
                   steps=int(t.steps), lr_warmup_steps=int(t.lr_warmup_steps),
                   lr_schedule=str(t.lr_schedule), epochs=int(t.epochs), mini_batches=int(t.mini_batches),
                   lora=lora, push_mode="keep" if t.partial_rollouts else "wait")


def load_learners(t: Any, policies: Sequence[Policy], device: Any = "cpu", *, model_cfg: Any) -> None:
    """Load every trainable policy's model and tokenizer from its `path` onto `device` (in `model_cfg`'s dtype,
    with its gradient checkpointing: `trained_model.py`); give it a learner. Under `model.lora` each trained policy
    gets an adapter of its own; a frozen one gets none (it is never loaded to train)."""
    from transformers import AutoTokenizer

    from agentrl.trainers.trained_model import load_trained_model, lora_settings

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
    `lr`). A policy without samples (every group dropped) logs zeros and `updates` 0 (trainers/no_update.py).
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
