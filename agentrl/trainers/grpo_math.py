"""GRPO's arithmetic: group-normalized advantages and the clipped policy-gradient loss.

Pure tensor functions, no model or I/O, so every number here can be checked by hand in a test.

Advantages. A *group* is every sample that answered the same prompt under the same role: the n rollouts
of one row for single-agent GRPO, or e.g. the solvers of one row (and separately its rewriters, and its
selector) in co-evolution. Each sample's advantage is (r - mean_group) / (std_group + eps); groups may
differ in size (a co-evolution row has 5 solvers but 1 selector). A group of one has no baseline to
compare with, so its advantage is 0 (it contributes no gradient), as does any group whose rewards are all
equal. The std is the population std (divide by n), which keeps a two-sample group at advantages +-1.

Loss. For model tokens t (loss mask 1) with rollout logprob q_t (the engine's log_softmax(logits/T) at
sampling time) and current logprob p_t, ratio_t = exp(p_t - q_t), and the per-token objective is
    -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)  (+ kl_coef * k3_t)
where A is the sample's advantage and k3_t = exp(ref_t - p_t) - (ref_t - p_t) - 1 is the k3 estimator of
KL(pi || pi_ref). The loss is the *sum* over every model token of the batch divided by the batch's total
number of model tokens ("token-level" normalization), so a long answer weighs as many tokens as it has
and micro-batches can be summed without reweighting.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


def group_advantages(rewards: Sequence[float] | torch.Tensor, groups: Sequence[Hashable],
                     eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """Per-sample advantages (r - group mean) / (group std + eps); 0 for groups of one or of equal rewards.

    `groups[i]` is sample i's group key, e.g. (row index, role). With `scale=False` only the mean is removed
    (Dr. GRPO style). Raises ValueError when the lengths differ or a reward is not finite.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if len(groups) != r.numel():
        raise ValueError(f"group_advantages: {r.numel()} rewards but {len(groups)} group keys")
    if not torch.isfinite(r).all():
        raise ValueError(f"group_advantages: rewards must be finite, got {r.tolist()}")
    out = torch.zeros_like(r)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        if len(idx) < 2:
            continue
        sub = r[idx]
        if bool(sub.max() == sub.min()):
            continue  # a tie carries no signal (and float noise in its std must not make one)
        centered = sub - sub.mean()
        if scale:
            std = sub.std(unbiased=False)
            centered = centered / (std + eps)
        out[idx] = centered
    return out.to(torch.float32)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) gathered at `targets` (same leading shape), in float32.

    It is what the engine reports for a sampled token, so ratios against rollout logprobs start at 1.
    """
    if temperature <= 0:
        temperature = 1.0  # greedy rollouts report T=1 logprobs
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@dataclass
class LossOutput:
    """The loss to backpropagate and its diagnostics (already divided by the normalizer)."""

    loss: torch.Tensor
    pg_loss: float
    kl: float  # mean k3 KL to the reference (0 without one)
    clip_fraction: float  # share of model tokens whose ratio left [1 - clip_low, 1 + clip_high] in the clipped direction
    approx_kl: float  # mean 0.5 * (log ratio)^2 between the current policy and the rollout policy
    tokens: int


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                normalizer: float | None = None) -> LossOutput:
    """The clipped PPO/GRPO surrogate over model tokens, summed and divided by `normalizer` tokens.

    Shapes: `logprobs`, `old_logprobs`, `mask` are [B, T]; `advantages` is [B] (one per sample) or [B, T].
    `normalizer` defaults to this batch's model-token count; pass the whole step's count when the step is
    split into micro-batches so that their gradients add up to the full batch's.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"policy_loss: shapes differ: logprobs {tuple(logprobs.shape)}, old "
                         f"{tuple(old_logprobs.shape)}, mask {tuple(mask.shape)}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logprobs")
    m = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logprobs)
    tokens = int(m.sum().item())
    norm = float(normalizer) if normalizer is not None else max(tokens, 1)
    log_ratio = (logprobs - old_logprobs.to(logprobs.dtype)) * m
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    pg = (per_token * m).sum() / norm
    loss = pg
    kl_value = 0.0
    if ref_logprobs is not None:
        delta = (ref_logprobs.to(logprobs.dtype) - logprobs) * m
        k3 = torch.exp(delta) - delta - 1.0
        kl_sum = (k3 * m).sum() / norm
        kl_value = float(kl_sum.detach())
        if kl_coef > 0:
            loss = loss + kl_coef * kl_sum
    with torch.no_grad():
        was_clipped = (clipped < unclipped) & (m > 0)  # the min picked the clipped branch: no gradient there
        clip_fraction = float(was_clipped.sum()) / norm
        approx_kl = float((0.5 * log_ratio.pow(2) * m).sum()) / norm
    return LossOutput(loss, float(pg.detach()), kl_value, clip_fraction, approx_kl, tokens)
