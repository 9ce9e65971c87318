"""The GRPO policy update: recompute logprobs, the configured loss over model tokens, AdamW step, weights to the engine."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from agentrl.config.algorithm import DEFAULT_ADVANTAGE, DEFAULT_CLIPS
from agentrl.config.model import LoraConfig
from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.devices import model_device
from agentrl.trainers.common.forward import first_loss_column, next_token_logits
from agentrl.trainers.common.lora import trainable_parameters
from agentrl.trainers.common.weight_push import push as push_weights
from agentrl.trainers.grpo.grpo_math import (
    group_advantages,
    logprobs_and_entropy,
    overlong_penalty,
    policy_loss,
    token_logprobs,
)
from agentrl.trainers.grpo.lr_schedules import lr_factor, set_lr
from agentrl.trainers.grpo.role_advantages import RoleBaselines, hierarchical_advantages, per_role_advantages

# What `Learner.step` logs under train/ (besides grad_norm and tokens); a step with nothing to train logs zeros.
STEP_METRICS = ("loss", "kl", "entropy", "clip_fraction", "approx_kl", "tis_weight_mean", "tis_clipped_frac",
                "logprob_gap_mean", "logprob_gap_max", "grad_norm", "tokens")


@dataclass(frozen=True)
class Algorithm:
    """The loss, advantage and regularizers of a GRPO-family update, every default resolved (docs/training.md).

    It has no defaults of its own: they are the schema's (`GRPOTrainerConfig`), through `from_config` (a trainer's
    settings) or `of` (the schema's defaults with some keys set)."""

    loss: str  # grpo | dr_grpo | dapo | gspo
    advantage: str  # group_norm | group_mean | rloo | per_role | rae | hierarchical
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_estimator: str
    entropy_coef: float
    tis_cap: float  # 0: ratios against the engine's logprobs, no importance weight
    tis_mode: str  # truncate | mask | ignore: a weight above tis_cap is cut, masked; or no correction
    tis_level: str  # token | sequence: one weight per token, or per sample
    norm_tokens: int  # dr_grpo's constant normalizer per sample
    overlong_max_tokens: int  # dapo's overlong penalty (0: none)
    overlong_buffer: int
    rae_decay: float  # advantage=rae: the per-role EMA baseline's decay
    episode_roles: tuple[str, ...]  # advantage=hierarchical: roles compared within one play

    @classmethod
    def from_config(cls, t: GRPOTrainerConfig) -> Algorithm:
        """The trainer's typed settings with their nulls filled by the loss's own defaults (`grpo_math`)."""
        low, high = DEFAULT_CLIPS[t.loss]
        max_tokens = (t.overlong_max_tokens or 0) if t.loss == "dapo" else 0
        buffer = t.overlong_buffer if t.overlong_buffer is not None else max(1, max_tokens // 5) if max_tokens else 0
        return cls(loss=t.loss, advantage=t.advantage or DEFAULT_ADVANTAGE[t.loss],
                   clip_low=low if t.clip_low is None else t.clip_low,
                   clip_high=high if t.clip_high is None else t.clip_high,
                   kl_coef=t.kl_coef, kl_estimator=t.kl_estimator, entropy_coef=t.entropy_coef, tis_cap=t.tis_cap,
                   tis_mode=t.tis_mode, tis_level=t.tis_level,
                   norm_tokens=t.norm_tokens, overlong_max_tokens=max_tokens, overlong_buffer=buffer,
                   rae_decay=float(t.rae_decay), episode_roles=tuple(t.episode_roles))

    @classmethod
    def of(cls, **keys: Any) -> Algorithm:
        """The algorithm of `trainer=grpo` at the schema's defaults with `keys` (its `trainer.*` keys) set, checked
        as the schema checks them. `overlong_max_tokens` (the agent's max_response_tokens in a run) defaults to
        null here: no overlong penalty."""
        return cls.from_config(GRPOTrainerConfig(**{"overlong_max_tokens": None, **keys}))


@dataclass
class TrainItem:
    """One sample as the learner needs it: tokens, mask, rollout logprobs, advantage."""

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float


def longest_reply(loss_mask: Sequence[int]) -> int:
    """The longest run of model tokens (loss mask 1) in a sample: its longest single reply."""
    best = run = 0
    for bit in loss_mask:
        run = run + 1 if bit else 0
        best = max(best, run)
    return best


def advantages_of(played: Sequence[Any], rewards: Sequence[float], algo: Algorithm,
                  baselines: RoleBaselines | None = None) -> torch.Tensor:
    """Each played sample's advantage under `algo.advantage`; `rae` reads and moves `baselines` (a fresh one
    when None: no memory of earlier steps)."""
    groups = [p.group for p in played]
    roles = [getattr(p, "role", "agent") for p in played]
    if algo.advantage == "per_role":
        return per_role_advantages(rewards, groups, roles)
    if algo.advantage == "hierarchical":
        return hierarchical_advantages(rewards, groups, roles, [getattr(p, "play_id", None) for p in played],
                                       algo.episode_roles)
    if algo.advantage == "rae":
        return (baselines or RoleBaselines(algo.rae_decay)).advantages(rewards, roles)
    return group_advantages(rewards, groups, kind=algo.advantage)


def items_from(played: Sequence[Any], policy: str | None = None, algorithm: Algorithm | None = None,
               baselines: RoleBaselines | None = None) -> tuple[list[TrainItem], torch.Tensor]:
    """Advantages (the algorithm's kind, within each group) for every played sample, and the items to train on.

    Every sample counts in its group's baseline; samples of frozen roles, samples without model tokens
    and, when `policy` is given, samples another policy played are then left out of the update. Under dapo
    a reply near or past `overlong_max_tokens` has its reward lowered before the advantages (DAPO's soft
    overlong punishment); the logged rewards are untouched.
    """
    algo = algorithm or Algorithm.of()
    rewards = [p.reward for p in played]
    if algo.overlong_max_tokens > 0:
        rewards = [r + overlong_penalty(longest_reply(p.sample.loss_mask) if p.sample is not None else 0,
                                        algo.overlong_max_tokens, algo.overlong_buffer)
                   for r, p in zip(rewards, played, strict=True)]
    adv = advantages_of(played, rewards, algo, baselines)
    items = [TrainItem(p.sample.token_ids, p.sample.loss_mask, p.sample.rollout_logprobs, float(a))
             for p, a in zip(played, adv.tolist(), strict=True)
             if not p.frozen and p.sample is not None and sum(p.sample.loss_mask) > 0
             and (policy is None or getattr(p, "policy", "main") == policy)]
    return items, adv


def _split(items: list[TrainItem], parts: int) -> list[list[TrainItem]]:
    """`items` in order, cut into min(parts, len) chunks whose sizes differ by at most one."""
    parts = min(parts, len(items))
    size, extra = divmod(len(items), parts)
    cuts = [i * size + min(i, extra) for i in range(parts + 1)]
    return [items[cuts[i]:cuts[i + 1]] for i in range(parts)]


class Learner:
    """A policy model and its AdamW optimizer (gradient clipping; the rate per step from `lr_schedules`, set by
    `at_step`, constant when never called), plus an optional frozen reference.

    It trains on the device the model is on, in the weights' dtype (float32: bf16 autocast on CUDA) with
    `algorithm`'s loss; the loose `clip_low/clip_high/kl_coef` keywords override the algorithm's (older callers
    and tests).
    """

    def __init__(self, model: torch.nn.Module, *, lr: float, weight_decay: float = 0.0, grad_clip: float = 1.0,
                 clip_low: float | None = None, clip_high: float | None = None, kl_coef: float | None = None,
                 temperature: float = 1.0, micro_batch_samples: int = 8, pad_id: int = 0,
                 algorithm: Algorithm | None = None, steps: int = 1, lr_warmup_steps: int = 0,
                 lr_schedule: str = "constant", epochs: int = 1, mini_batches: int = 1,
                 lora: LoraConfig | None = None,
                 push_mode: str = "wait") -> None:
        algo = algorithm or Algorithm.of()
        self.algorithm = replace(algo, clip_low=algo.clip_low if clip_low is None else clip_low,
                                 clip_high=algo.clip_high if clip_high is None else clip_high,
                                 kl_coef=algo.kl_coef if kl_coef is None else kl_coef)
        self.model = model
        self.push_mode = push_mode  # wait | keep (partial rollouts: `EmbeddedEngine.update_weights`)
        self.lora = lora  # the `model.lora` settings of a LoRA-wrapped model (what a push sends), else None
        self.pushed_bytes = 0  # what the last push handed the engine
        # Under LoRA only the adapter requires grad: AdamW keeps no state for the frozen base.
        self.optimizer = torch.optim.AdamW(trainable_parameters(model), lr=lr, weight_decay=weight_decay)
        self.base_lr, self.steps = float(lr), int(steps)
        self.lr_warmup_steps, self.lr_schedule = int(lr_warmup_steps), str(lr_schedule)
        lr_factor(1, self.steps, self.lr_warmup_steps, self.lr_schedule)  # a bad schedule fails here, not at step 1
        self.grad_clip = grad_clip
        self.temperature = temperature
        self.micro = max(1, int(micro_batch_samples))
        if int(epochs) < 1 or int(mini_batches) < 1:
            raise ValueError(f"epochs and mini_batches must be >= 1, got {epochs} and {mini_batches}")
        self.epochs, self.mini_batches = int(epochs), int(mini_batches)
        self.pad_id = pad_id
        self.device = model_device(model)
        self.reference = None
        if self.algorithm.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.baselines = RoleBaselines(self.algorithm.rae_decay)  # advantage=rae's per-role baselines, run-long

    def at_step(self, step: int) -> float:
        """Set the optimizer's rate for trainer step `step` (1-based) from the schedule; returns it."""
        return set_lr(self.optimizer, self.base_lr, lr_factor(step, self.steps, self.lr_warmup_steps,
                                                              self.lr_schedule))

    def items(self, played: Sequence[Any], policy: str | None = None) -> tuple[list[TrainItem], torch.Tensor]:
        """`items_from` with this learner's advantage and reward shaping."""
        return items_from(played, policy=policy, algorithm=self.algorithm, baselines=self.baselines)

    def _batch(self, items: Sequence[TrainItem]) -> tuple[torch.Tensor, ...]:
        width = max(len(i.token_ids) for i in items)
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(items), width), dtype=torch.long)
        mask = torch.zeros((len(items), width))
        old = torch.zeros((len(items), width))
        for r, it in enumerate(items):
            n = len(it.token_ids)
            ids[r, :n] = torch.tensor(it.token_ids)
            attn[r, :n] = 1
            mask[r, :n] = torch.tensor(it.loss_mask, dtype=torch.float32)
            old[r, :n] = torch.tensor(it.rollout_logprobs, dtype=torch.float32)
        adv = torch.tensor([it.advantage for it in items])
        # Position t's logits predict token t + 1.
        return tuple(t.to(self.device, non_blocking=True) for t in (ids, attn, mask[:, 1:], old[:, 1:], adv))

    def step(self, items: Sequence[TrainItem]) -> dict[str, float]:
        """`epochs` passes over `items`, each split into `mini_batches` optimizer steps (micro-batched; every
        normalizer spans its mini-batch). The metrics are the mean over those updates (`tokens`: the batch's,
        `logprob_gap_max`: the largest).

        With one update (the default) every micro-batch runs its forward pass before the single optimizer step,
        so each sees the weights the rollouts were played with: the "old" policy of the truncated importance
        weights. With several, that old policy is one no-grad pass over the batch before the first update.
        """
        if not items:
            return {}
        self.model.train()
        chunks = _split(list(items), self.mini_batches)
        behaviour = None
        if self.algorithm.tis_cap > 0 and self.epochs * len(chunks) > 1:
            behaviour = {id(it): lp for it, lp in zip(items, self._logprobs(items), strict=True)}
        results = [self._update(chunk, behaviour) for _ in range(self.epochs) for chunk in chunks]
        self.model.eval()
        out = {k: sum(r[k] for r in results) / len(results) for k in results[0]}
        out["train/logprob_gap_max"] = max(r["train/logprob_gap_max"] for r in results)
        out["train/tokens"] = float(sum(int(sum(it.loss_mask)) for it in items))
        return out

    def _logprobs(self, items: Sequence[TrainItem]) -> list[torch.Tensor]:
        """Each item's logprob of its tokens 1..n under the current weights, without gradient ([n - 1] each)."""
        out: list[torch.Tensor] = []
        with torch.no_grad():
            for start in range(0, len(items), self.micro):
                chunk = items[start:start + self.micro]
                ids, attn, mask, _, _ = self._batch(chunk)
                first = first_loss_column(mask)
                logp = token_logprobs(next_token_logits(self.model, ids, attn, first), ids[:, first + 1:],
                                      self.temperature)
                for r, it in enumerate(chunk):
                    row = torch.zeros(len(it.token_ids) - 1, device=logp.device)
                    row[first:] = logp[r, :len(it.token_ids) - 1 - first]
                    out.append(row)
        return out

    def _update(self, items: Sequence[TrainItem], behaviour: dict[int, torch.Tensor] | None) -> dict[str, float]:
        """One optimizer step over `items`; `behaviour`: each item's logprobs before the batch's first update."""
        a = self.algorithm
        total = sum(int(sum(it.loss_mask)) for it in items)
        self.optimizer.zero_grad(set_to_none=True)
        keys = ("loss", "kl", "entropy", "clip_fraction", "approx_kl", "tis_weight", "tis_clipped",
                "logprob_gap_mean")
        sums = dict.fromkeys(keys, 0.0)
        gap_max = 0.0  # |learner - engine logprob| of the worst token of the step (a max, not a sum)
        for start in range(0, len(items), self.micro):
            chunk = items[start:start + self.micro]
            ids, attn, mask, old, adv = self._batch(chunk)
            # Prompt positions before the first model token need no logits.
            first = first_loss_column(mask)
            mask, old, targets = mask[:, first:], old[:, first:], ids[:, first + 1:]
            beh = None
            if behaviour is not None:
                beh = torch.zeros_like(old)
                for r, it in enumerate(chunk):
                    lp = behaviour[id(it)][first:]
                    beh[r, :lp.numel()] = lp
            logits = next_token_logits(self.model, ids, attn, first)
            # The entropy needs the whole distribution; it joins the graph only when it is trained.
            logp, ent = logprobs_and_entropy(logits, targets, self.temperature, entropy_grad=a.entropy_coef != 0)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = token_logprobs(next_token_logits(self.reference, ids, attn, first), targets,
                                         self.temperature)
            out = policy_loss(logp, old, adv, mask, loss=a.loss, clip_low=a.clip_low, clip_high=a.clip_high,
                              ref_logprobs=ref, kl_coef=a.kl_coef, kl_estimator=a.kl_estimator, entropy=ent,
                              entropy_coef=a.entropy_coef, tis_cap=a.tis_cap, tis_mode=a.tis_mode,
                              tis_level=a.tis_level, normalizer=total,
                              num_samples=len(items), norm_tokens=a.norm_tokens, behaviour_logprobs=beh)
            out.loss.backward()
            sums["loss"] += float(out.loss.detach())
            for k in keys[1:]:
                sums[k] += getattr(out, k)
            gap_max = max(gap_max, out.logprob_gap_max)
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable_parameters(self.model), self.grad_clip)
        self.optimizer.step()
        sums["tis_weight_mean"], sums["tis_clipped_frac"] = sums.pop("tis_weight"), sums.pop("tis_clipped")
        sums["logprob_gap_max"] = gap_max
        return {f"train/{k}": v for k, v in sums.items()} | {"train/grad_norm": float(grad_norm),
                                                             "train/tokens": float(total)}

    def push(self, engine: Any) -> float:
        """Copy the policy's weights into the engine (under LoRA its adapter, or the merged weights:
        `lora.push`); returns the seconds it took, and keeps the bytes sent in `pushed_bytes`."""
        started = time.monotonic()
        # keep (trainer.partial_rollouts): the engine applies the push between two decode steps
        keep = {"mode": "keep"} if self.push_mode == "keep" else {}
        self.pushed_bytes = push_weights(self.model, engine, self.lora, **keep)
        return time.monotonic() - started
