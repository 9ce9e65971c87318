"""GRPO arithmetic against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainers.grpo_math import group_advantages, policy_loss, token_logprobs


def test_advantages_by_group_hand_computed() -> None:
    # group a: rewards 1, 0 -> mean .5, std .5 -> +1, -1; group b: 0, 0, 3 -> mean 1, std sqrt(2)
    adv = group_advantages([1.0, 0.0, 0.0, 0.0, 3.0], ["a", "a", "b", "b", "b"], eps=0.0)
    s = math.sqrt(2.0)
    assert adv.tolist() == pytest.approx([1.0, -1.0, -1 / s, -1 / s, 2 / s], abs=1e-6)


def test_advantages_varying_sizes_singletons_and_ties_are_zero() -> None:
    groups = [(0, "solver")] * 3 + [(0, "selector")] + [(1, "solver")] * 2
    adv = group_advantages([0.2, 0.2, 0.2, 1.0, 0.0, 1.0], groups)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]  # a tie and a group of one: no signal
    assert adv[4:].tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_advantages_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="group keys"):
        group_advantages([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="finite"):
        group_advantages([float("nan"), 1.0], ["a", "a"])


def test_loss_on_policy_equals_minus_mean_token_advantage() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.1, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    out = policy_loss(lp, lp.detach(), adv, mask)
    # ratio 1 everywhere: loss = -(2 + 2 - 1 - 1) / 4 tokens
    assert out.loss.item() == pytest.approx(-0.5)
    assert out.tokens == 4 and out.clip_fraction == 0.0 and out.approx_kl == 0.0
    out.loss.backward()
    # d/dlp of -ratio*A/N at ratio 1 is -A/N on model tokens, 0 on masked ones
    assert lp.grad.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.0, 0.0, 0.25, 0.25])


def test_clipped_ratio_with_stale_logprobs() -> None:
    # Rollout logprobs are stale: the policy moved since sampling. Ratios: e^0.5=1.65, e^-0.5=0.61, e^0.1=1.105
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    lp = torch.tensor([[-0.5, -1.5, -0.9]], requires_grad=True)
    mask = torch.ones(1, 3)
    out = policy_loss(lp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.3)
    r = [math.exp(0.5), math.exp(-0.5), math.exp(0.1)]
    # A > 0: min(r, clip(r)) -> token 0 clipped to 1.3 (no gradient), token 1 keeps 0.61, token 2 keeps 1.105
    expected = -(1.3 + r[1] + r[2]) / 3
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.clip_fraction == pytest.approx(1 / 3)
    out.loss.backward()
    assert lp.grad[0, 0].item() == 0.0  # clipped: no gradient
    assert lp.grad[0, 1].item() == pytest.approx(-r[1] / 3, rel=1e-5)
    # negative advantage: the low side clips (token 1: ratio .61 < .8 -> max(-.61, -.8) = -.61 -> loss .8)
    out_neg = policy_loss(lp.detach(), old, torch.tensor([-1.0]), mask, clip_low=0.2, clip_high=0.3)
    assert out_neg.loss.item() == pytest.approx((r[0] + 0.8 + r[2]) / 3, rel=1e-6)
    assert out_neg.clip_fraction == pytest.approx(1 / 3)
    assert out.approx_kl == pytest.approx((0.5 * 0.25 * 2 + 0.5 * 0.01) / 3, rel=1e-5)


def test_kl_k3_and_normalizer() -> None:
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    mask = torch.ones(1, 2)
    out = policy_loss(lp, lp, torch.tensor([0.0]), mask, ref_logprobs=ref, kl_coef=0.5, normalizer=4)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert out.kl == pytest.approx(k3 / 4, rel=1e-6)
    assert out.loss.item() == pytest.approx(0.5 * k3 / 4, rel=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp, torch.tensor([0.0]), mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="shapes"):
        policy_loss(lp, lp[:, :1], torch.tensor([0.0]), mask)


def test_micro_batches_sum_to_full_batch_gradient() -> None:
    torch.manual_seed(0)
    lp = torch.randn(4, 5, requires_grad=True)
    old = lp.detach() + 0.1 * torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).long()
    adv = torch.randn(4)
    full = policy_loss(lp, old, adv, mask)
    (g_full,) = torch.autograd.grad(full.loss, lp)
    n = int(mask.sum())
    parts = [policy_loss(lp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], normalizer=n) for i in (0, 2)]
    (g_parts,) = torch.autograd.grad(parts[0].loss + parts[1].loss, lp)
    assert torch.allclose(g_full, g_parts, atol=1e-6)


def test_token_logprobs_temperature() -> None:
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    got = token_logprobs(logits, torch.tensor([[1]]), temperature=2.0)
    want = torch.log_softmax(torch.tensor([1.0, 0.0, -0.5]), -1)[1]
    assert got.item() == pytest.approx(want.item())
