"""GRPO-family arithmetic: advantages, the four policy losses, KL and entropy terms, truncated importance sampling.

Pure tensor functions, no model or I/O, so every number here can be checked by hand in a test
(tests/trainers/test_grpo_math.py). docs/training.md "Algorithms" gives each choice's paper and formula.

Advantages. A *group* is every sample that answered the same prompt under the same role: the n rollouts
of one row for single-agent GRPO, or e.g. the solvers of one row (and separately its rewriters, and its
selector) in co-evolution. Groups may differ in size. `group_norm`: (r - mean) / (std + eps) with the
population std (a two-sample group gets +-1); `group_mean`: r - mean; `rloo`: r - mean of the *others*
(= n/(n-1) (r - mean)). A group of one has no baseline, so its advantage is 0, as is any group of equal rewards.
The per-role choices (`per_role`, `rae`, `hierarchical`) need each sample's role and play: `role_advantages.py`.

Losses, over model tokens t (loss mask 1) of sample i with advantage A_i, current logprob p_t and behaviour
logprob b_t (the engine's rollout logprob q_t, or with truncated importance sampling the learner's own
logprob at the batch's start: see `tis_cap` below); both are log_softmax(logits / T) at the sampling temperature.
  grpo, dapo:  per token -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A), r_t = exp(p_t - b_t);
               summed over every model token of the step, divided by the step's model-token count (token-level).
  dr_grpo:     the same per-token term, divided by a constant (samples x `norm_tokens`): no length normalization.
  gspo:        one ratio per sequence, s_i = exp(mean_t (p_t - b_t)), clipped per sequence;
               -min(s_i A, clip(s_i) A) averaged over the step's samples (sequence-level).
Optional terms, both token means over the step's model tokens: + kl_coef * KL(pi || pi_ref) (estimator k1:
p - ref, or k3: exp(ref - p) - (ref - p) - 1) and - entropy_coef * H (the policy's entropy at each position).

Truncated importance sampling (TIS, `tis_cap` C > 0). The engine that sampled (q) and the learner (p) compute
slightly different probabilities for the same weights (bf16, other kernels, SGLang). With TIS the PPO ratio is
taken against the learner's own logprob at the start of the batch (p_old: p detached when the batch takes one
update; with several, `trainer.epochs` / `mini_batches`, the learner's pass before its first update, given as
`behaviour_logprobs`), and each token's term is multiplied by w_t = min(exp(p_old_t - q_t), C), detached (gspo: one
w_i = min(exp(mean_t (p_old_t - q_t)), C) per sequence). With C = 0 the ratio is taken against q directly (the
pre-TIS behaviour). Where the engine and learner agree, both give the same value and gradient.
`tis_mode=mask` keeps w_t = exp(p_old_t - q_t) uncut but drops the terms whose w_t exceeds C (weight 0), as
masked importance sampling does: a token of a stale or partial rollout far likelier under the learner than
under the engine that sampled it leaves the loss instead of entering it at weight C. `tis_level=sequence`
uses one weight per sample (the geometric mean over its tokens, as gspo) on each of its tokens.
`tis_mode=ignore` turns every correction off: the ratio is taken against p_old and every weight is 1, whatever
`tis_cap`, so a stale or partial rollout trains as if the learner's current weights had sampled it (what
`trainer.max_staleness` costs without correction: issue 31's proof 2; NeMo-RL found async needs the correction).
With partial rollouts q_t is the logprob of the weights that sampled token t (`Completion.token_versions`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from agentrl.config.algorithm import KL_ESTIMATORS, LOSSES, TIS_LEVELS, TIS_MODES

SEQUENCE_LOSSES = ("gspo",)  # one ratio and one loss term per sample
GROUP_ADVANTAGES = ("group_norm", "group_mean", "rloo")  # ADVANTAGES that need only the group keys


def group_advantages(rewards: Sequence[float] | torch.Tensor, groups: Sequence[Hashable],
                     eps: float = 1e-6, scale: bool = True, *, kind: str | None = None) -> torch.Tensor:
    """Per-sample advantages within each group; 0 for groups of one or of equal rewards.

    `groups[i]` is sample i's group key, e.g. (row index, role). `kind` is one of GROUP_ADVANTAGES (default
    group_norm; `scale=False` is the older spelling of group_mean). Raises ValueError when the lengths
    differ, a reward is not finite or the kind is unknown.
    """
    kind = kind or ("group_norm" if scale else "group_mean")
    if kind not in GROUP_ADVANTAGES:
        raise ValueError(f"group_advantages: advantage kind must be one of {GROUP_ADVANTAGES}, got {kind!r} "
                         "(per_role, rae and hierarchical are role_advantages.py's)")
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
        n = len(idx)
        if n < 2:
            continue
        sub = r[idx]
        if bool(sub.max() == sub.min()):
            continue  # a tie carries no signal (and float noise in its std must not make one)
        centered = sub - sub.mean()
        if kind == "group_norm":
            centered = centered / (sub.std(unbiased=False) + eps)
        elif kind == "rloo":
            centered = centered * (n / (n - 1))  # r_i - (sum - r_i) / (n - 1)
        out[idx] = centered
    return out.to(torch.float32)


def overlong_penalty(length: int, max_tokens: int, buffer: int) -> float:
    """DAPO's soft overlong punishment: 0 up to max - buffer tokens, then linear down to -1 at max, -1 beyond."""
    if max_tokens <= 0:
        return 0.0
    start = max_tokens - buffer
    if length <= start:
        return 0.0
    if length > max_tokens:
        return -1.0
    return (start - length) / buffer


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) gathered at `targets` (same leading shape), in float32.

    It is what the engine reports for a sampled token, so ratios against rollout logprobs start at 1.
    """
    return logprobs_and_entropy(logits, targets, temperature, entropy=False)[0]


def logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *,
                         entropy: bool = True, entropy_grad: bool = True
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` and, with `entropy`, each position's entropy -sum_v p_v log p_v of softmax(logits / T).

    Without `entropy_grad` the entropy is computed outside the graph (logged, not trained: no [B, T, V] kept).
    """
    if temperature <= 0:
        temperature = 1.0  # greedy rollouts report T=1 logprobs
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp.exp() * logp).sum(-1)
    return picked, ent


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi: k1 = p - ref, k3 = e^(ref-p) - (ref-p) - 1."""
    delta = ref_logprobs.to(logprobs.dtype) - logprobs
    if estimator == "k1":
        return -delta
    if estimator == "k3":
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def _seq_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Each row's mean over its model tokens ([B, T] -> [B]); 0 for a row without any."""
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1.0)


@dataclass
class LossOutput:
    """The loss to backpropagate and its diagnostics (each already divided by its step-wide normalizer)."""

    loss: torch.Tensor
    pg_loss: float
    kl: float  # mean KL estimate to the reference (0 without one)
    clip_fraction: float  # share of tokens (gspo: samples) the min sent to the clipped branch (no gradient)
    approx_kl: float  # mean 0.5 * (p - b)^2 between the current policy and the behaviour policy
    tokens: int
    entropy: float = 0.0  # mean entropy of the policy at model-token positions (0 when not given)
    tis_weight: float = 0.0  # mean truncated IS weight (tokens; gspo: samples); 0 with TIS off
    tis_clipped: float = 0.0  # share of tokens (gspo: samples) whose IS weight was cut to the cap
    logprob_gap_mean: float = 0.0  # mean |p - q|: learner vs engine logprob of the same token
    logprob_gap_max: float = 0.0  # the largest |p - q| of one model token in this batch


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, loss: str = "grpo", clip_low: float = 0.2, clip_high: float = 0.2,
                ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                entropy: torch.Tensor | None = None, entropy_coef: float = 0.0, tis_cap: float = 0.0,
                tis_mode: str = "truncate", tis_level: str = "token", normalizer: float | None = None, num_samples: float | None = None,
                norm_tokens: float | None = None, behaviour_logprobs: torch.Tensor | None = None) -> LossOutput:
    """One of LOSSES over model tokens (see the module docstring), with optional KL, entropy and TIS terms.

    Shapes: `logprobs` (current, with gradient), `old_logprobs` (the engine's rollout logprobs), `mask`,
    `ref_logprobs`, `entropy` are [B, T]; `advantages` is [B] (one per sample) or [B, T] (token losses only).
    When a step is split into micro-batches, pass the whole step's `normalizer` (model tokens) and
    `num_samples` so that the micro-batches' gradients add up to the full batch's; they default to this
    batch's. `norm_tokens` is dr_grpo's constant per-sample token budget. `behaviour_logprobs` [B, T]: the
    learner's own logprobs before the batch's first update (TIS's p_old); None: `logprobs` detached.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"policy_loss: shapes differ: logprobs {tuple(logprobs.shape)}, old "
                         f"{tuple(old_logprobs.shape)}, mask {tuple(mask.shape)}")
    if loss not in LOSSES:
        raise ValueError(f"policy_loss: loss must be one of {LOSSES}, got {loss!r}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logprobs")
    if entropy_coef != 0 and entropy is None:
        raise ValueError("policy_loss: entropy_coef needs the entropy")
    if loss == "dr_grpo" and not (norm_tokens and norm_tokens > 0):
        raise ValueError("policy_loss: dr_grpo needs norm_tokens > 0 (its constant normalizer)")
    m = mask.to(logprobs.dtype)
    q = old_logprobs.to(logprobs.dtype)
    tokens = int(m.sum().item())
    norm = float(normalizer) if normalizer is not None else max(tokens, 1)
    n_seq = float(num_samples) if num_samples is not None else logprobs.shape[0]
    sequence = loss in SEQUENCE_LOSSES
    adv = advantages.to(logprobs.dtype)
    if sequence and adv.dim() != 1:
        raise ValueError(f"policy_loss: {loss} takes one advantage per sample, got shape {tuple(adv.shape)}")
    if adv.dim() == 1 and not sequence:
        adv = adv[:, None].expand_as(logprobs)
    # The ratio's baseline b: the rollout policy, or with TIS the learner's own old policy (see the docstring).
    old = logprobs.detach() if behaviour_logprobs is None else behaviour_logprobs.to(logprobs.dtype)
    ignore = tis_mode == "ignore"
    base = old if tis_cap > 0 or ignore else q
    log_ratio = (logprobs - base) * m
    gap = (old - q) * m  # log(pi_learner / pi_engine) of the sampled tokens, at the batch's start
    if tis_mode not in TIS_MODES or tis_level not in TIS_LEVELS:
        raise ValueError(f"policy_loss: tis_mode must be one of {TIS_MODES} and tis_level one of {TIS_LEVELS}, "
                         f"got {tis_mode!r}, {tis_level!r}")
    if sequence:
        log_ratio = _seq_mean(log_ratio, m)
        gap = _seq_mean(gap, m)
    elif tis_level == "sequence":  # one weight per sample, on each of its tokens
        gap = _seq_mean(gap, m)[:, None].expand_as(log_ratio)
    weight = torch.ones_like(gap)
    if tis_cap > 0 and not ignore:
        raw = torch.exp(gap)
        # mask with where, not raw * (raw <= cap): exp of a large gap is inf, and inf * 0 is NaN
        weight = raw.clamp(max=tis_cap) if tis_mode == "truncate" else torch.where(raw <= tis_cap, raw, 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    term = -torch.minimum(unclipped, clipped) * weight
    if sequence:
        pg = term.sum() / n_seq
    elif loss == "dr_grpo":
        assert norm_tokens is not None  # checked > 0 above
        pg = (term * m).sum() / (n_seq * float(norm_tokens))
    else:
        pg = (term * m).sum() / norm
    total = pg
    kl_value = 0.0
    if ref_logprobs is not None:
        kl_sum = (kl_estimate(logprobs, ref_logprobs, kl_estimator) * m).sum() / norm
        kl_value = float(kl_sum.detach())
        if kl_coef > 0:
            total = total + kl_coef * kl_sum
    ent_value = 0.0
    if entropy is not None:
        ent_sum = (entropy.to(logprobs.dtype) * m).sum() / norm
        ent_value = float(ent_sum.detach())
        if entropy_coef != 0:
            total = total - entropy_coef * ent_sum  # maximizing entropy: a bonus, so it is subtracted
    with torch.no_grad():
        on = m > 0 if not sequence else m.sum(-1) > 0
        per = n_seq if sequence else norm
        was_clipped = (clipped < unclipped) & on  # the min picked the clipped branch: no gradient there
        clip_fraction = float(was_clipped.sum()) / per
        approx_kl = float((0.5 * log_ratio.pow(2) * (on if sequence else m)).sum()) / per
        weighted = tis_cap > 0 and not ignore
        tis_weight = float((weight * on).sum()) / per if weighted else 0.0
        tis_clipped = float(((raw > tis_cap) & on).sum()) / per if weighted else 0.0
        # The engine's kernels (vLLM's, bf16 on a GPU) differ from the learner's pass: what TIS corrects.
        abs_gap = (old - q).abs() * m
        gap_mean = float(abs_gap.sum()) / norm
        gap_max = float(abs_gap.max()) if abs_gap.numel() else 0.0
    return LossOutput(total, float(pg.detach()), kl_value, clip_fraction, approx_kl, tokens, ent_value,
                      tis_weight, tis_clipped, gap_mean, gap_max)

