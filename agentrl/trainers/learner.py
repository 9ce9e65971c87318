"""The GRPO policy update: recompute logprobs, clipped loss over model tokens, AdamW step, weights to the engine."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.devices import model_device
from agentrl.trainers.forward import first_loss_column, next_token_logits
from agentrl.trainers.grpo_math import group_advantages, policy_loss, token_logprobs


@dataclass
class TrainItem:
    """One sample as the learner needs it: tokens, mask, rollout logprobs, advantage."""

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float


def items_from(played: Sequence[Any], policy: str | None = None) -> tuple[list[TrainItem], torch.Tensor]:
    """Group-normalized advantages for every played sample and the items to train on.

    Every sample counts in its group's baseline; samples of frozen roles, samples without model tokens
    and, when `policy` is given, samples another policy played are then left out of the update.
    """
    adv = group_advantages([p.reward for p in played], [p.group for p in played])
    items = [TrainItem(p.sample.token_ids, p.sample.loss_mask, p.sample.rollout_logprobs, float(a))
             for p, a in zip(played, adv.tolist(), strict=True)
             if not p.frozen and sum(p.sample.loss_mask) > 0
             and (policy is None or getattr(p, "policy", "main") == policy)]
    return items, adv


class Learner:
    """A policy model and its AdamW optimizer (constant LR, gradient clipping), plus an optional frozen reference.

    It trains on the device the model is on (float32 weights; bf16 autocast on CUDA).
    """

    def __init__(self, model: torch.nn.Module, *, lr: float, weight_decay: float = 0.0, grad_clip: float = 1.0,
                 clip_low: float = 0.2, clip_high: float = 0.2, kl_coef: float = 0.0, temperature: float = 1.0,
                 micro_batch_samples: int = 8, pad_id: int = 0) -> None:
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.grad_clip = grad_clip
        self.clip_low, self.clip_high = clip_low, clip_high
        self.kl_coef = kl_coef
        self.temperature = temperature
        self.micro = max(1, int(micro_batch_samples))
        self.pad_id = pad_id
        self.device = model_device(model)
        self.reference = None
        if kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)

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
        """One optimizer step over all `items` (micro-batched); the loss is token-normalized over the whole step."""
        if not items:
            return {}
        self.model.train()
        total = sum(int(sum(it.loss_mask)) for it in items)
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
        for start in range(0, len(items), self.micro):
            ids, attn, mask, old, adv = self._batch(items[start:start + self.micro])
            # Prompt positions before the first model token need no logits.
            first = first_loss_column(mask)
            mask, old, targets = mask[:, first:], old[:, first:], ids[:, first + 1:]
            logp = token_logprobs(next_token_logits(self.model, ids, attn, first), targets, self.temperature)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = token_logprobs(next_token_logits(self.reference, ids, attn, first), targets,
                                         self.temperature)
            out = policy_loss(logp, old, adv, mask, clip_low=self.clip_low, clip_high=self.clip_high,
                              ref_logprobs=ref, kl_coef=self.kl_coef, normalizer=total)
            out.loss.backward()
            sums["loss"] += float(out.loss.detach())
            sums["kl"] += out.kl
            sums["clip_fraction"] += out.clip_fraction
            sums["approx_kl"] += out.approx_kl
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.model.eval()
        return {f"train/{k}": v for k, v in sums.items()} | {"train/grad_norm": float(grad_norm),
                                                             "train/tokens": float(total)}

    def push(self, engine: Any) -> float:
        """Copy the policy's weights into the engine; returns the seconds it took."""
        started = time.monotonic()
        engine.update_weights({k: v.detach() for k, v in self.model.state_dict().items()})
        return time.monotonic() - started
