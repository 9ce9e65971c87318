"""GRPO arithmetic against hand-computed values."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from agentrl.agents.record import Rollout
from agentrl.trainers.grpo.grpo_math import (
    group_advantages,
    kl_estimate,
    logprobs_and_entropy,
    overlong_penalty,
    policy_loss,
    token_logprobs,
)
from agentrl.trainers.grpo.learner import Algorithm, items_from, longest_reply


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


# ---------------------------------------------------------------- the GRPO family (trainer.loss / advantage / ...)

GROUPS = ["a", "a", "b", "b", "b"]
REWARDS = [1.0, 0.0, 0.0, 0.0, 3.0]


def test_group_mean_removes_only_the_mean() -> None:
    # a: mean .5 -> +.5, -.5; b: mean 1 -> -1, -1, 2
    adv = group_advantages(REWARDS, GROUPS, kind="group_mean")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -1.0, -1.0, 2.0])
    assert group_advantages(REWARDS, GROUPS, scale=False).tolist() == adv.tolist()  # the older spelling


def test_rloo_baseline_leaves_the_sample_out() -> None:
    # a (n=2): 1 - 0, 0 - 1; b (n=3): 0 - (0+3)/2, 0 - (0+3)/2, 3 - (0+0)/2
    adv = group_advantages(REWARDS, GROUPS, kind="rloo")
    assert adv.tolist() == pytest.approx([1.0, -1.0, -1.5, -1.5, 3.0])


@pytest.mark.parametrize("kind", ["group_norm", "group_mean", "rloo"])
def test_every_advantage_gives_zero_to_singletons_and_ties_in_role_groups(kind: str) -> None:
    # A co-evolution row: 3 tied solvers, one selector (a group of one), two rewriters that differ.
    groups = [(0, "solver")] * 3 + [(0, "selector")] + [(0, "rewriter")] * 2
    adv = group_advantages([0.5, 0.5, 0.5, 1.0, 0.2, 1.0], groups, kind=kind)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    want = {"group_norm": 1.0, "group_mean": 0.4, "rloo": 0.8}[kind]  # (1.0 - 0.2) split around the mean
    assert adv[4:].tolist() == pytest.approx([-want, want], abs=1e-5)
    with pytest.raises(ValueError, match="advantage kind"):
        group_advantages([1.0], ["a"], kind="ppo")


def _two_samples() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample 0 has 1 model token (A=+1), sample 1 has 3 (A=-1); on-policy (ratio 1)."""
    lp = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    return lp, mask, torch.tensor([1.0, -1.0])


def test_token_level_aggregation_weighs_every_token() -> None:
    lp, mask, adv = _two_samples()
    out = policy_loss(lp, lp.detach(), adv, mask, loss="grpo")
    assert out.loss.item() == pytest.approx(-(1 - 3) / 4)  # sum over 4 tokens / 4
    out.loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-0.25, 0.0, 0.0, 0.25, 0.25, 0.25])


def test_dr_grpo_divides_by_a_constant_not_by_lengths() -> None:
    lp, mask, adv = _two_samples()
    out = policy_loss(lp, lp.detach(), adv, mask, loss="dr_grpo", norm_tokens=10)
    assert out.loss.item() == pytest.approx(-(1 - 3) / (2 * 10))  # 2 samples x 10 tokens
    out.loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-0.05, 0.0, 0.0, 0.05, 0.05, 0.05])
    with pytest.raises(ValueError, match="norm_tokens"):
        policy_loss(lp, lp.detach(), adv, mask, loss="dr_grpo")


def test_gspo_is_sequence_level() -> None:
    lp, mask, adv = _two_samples()
    out = policy_loss(lp, lp.detach(), adv, mask, loss="gspo")
    assert out.loss.item() == pytest.approx(-(1 - 1) / 2)  # one term per sample, averaged over samples
    out.loss.backward()
    # d s_i / d p_t = s_i / |o_i|: sample 0's token -1/2, sample 1's tokens +1/(2*3)
    assert lp.grad.flatten().tolist() == pytest.approx([-0.5, 0.0, 0.0, 1 / 6, 1 / 6, 1 / 6])


def test_gspo_ratio_is_exp_of_the_mean_token_log_ratio_and_clips_per_sequence() -> None:
    old = torch.tensor([[-1.0, -1.0]])
    lp = torch.tensor([[-0.9, -0.7]], requires_grad=True)  # log ratios 0.1, 0.3 -> s = e^0.2
    mask = torch.ones(1, 2)
    s = math.exp(0.2)
    assert s != pytest.approx((math.exp(0.1) + math.exp(0.3)) / 2)  # not the mean of the token ratios
    out = policy_loss(lp, old, torch.tensor([1.0]), mask, loss="gspo", clip_low=0.3, clip_high=0.3)
    assert out.loss.item() == pytest.approx(-s)
    assert out.clip_fraction == 0.0
    out.loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-s / 2, -s / 2])
    # GSPO's own clip range (3e-4, 4e-4): s is cut to 1.0004, and the sequence gets no gradient
    lp.grad = None
    out = policy_loss(lp, old, torch.tensor([1.0]), mask, loss="gspo", clip_low=3e-4, clip_high=4e-4)
    assert out.loss.item() == pytest.approx(-1.0004)
    assert out.clip_fraction == 1.0
    out.loss.backward()
    assert lp.grad.abs().sum().item() == 0.0
    with pytest.raises(ValueError, match="one advantage per sample"):
        policy_loss(lp, old, torch.ones(1, 2), mask, loss="gspo")


def test_dapo_decoupled_clip_lets_the_high_side_go_further() -> None:
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    lp = torch.tensor([[-0.8, -0.7, -1.3]])  # ratios e^0.2 = 1.2214, e^0.3 = 1.3499, e^-0.3 = 0.7408
    mask = torch.ones(1, 3)
    pos = torch.tensor([1.0])
    dapo = policy_loss(lp, old, pos, mask, loss="dapo", clip_low=0.2, clip_high=0.28)
    # A > 0: 1.2214 stays (under 1.28), 1.3499 is cut to 1.28, 0.7408 stays (the low side never binds for A > 0)
    assert dapo.loss.item() == pytest.approx(-(math.exp(0.2) + 1.28 + math.exp(-0.3)) / 3, rel=1e-6)
    assert dapo.clip_fraction == pytest.approx(1 / 3)
    symmetric = policy_loss(lp, old, pos, mask, loss="grpo", clip_low=0.2, clip_high=0.2)
    assert symmetric.loss.item() == pytest.approx(-(1.2 + 1.2 + math.exp(-0.3)) / 3, rel=1e-6)
    assert symmetric.clip_fraction == pytest.approx(2 / 3)
    # A < 0: only the low side binds: 0.7408 -> 0.8, the others keep their ratios
    neg = policy_loss(lp, old, -pos, mask, loss="dapo", clip_low=0.2, clip_high=0.28)
    assert neg.loss.item() == pytest.approx((math.exp(0.2) + math.exp(0.3) + 0.8) / 3, rel=1e-6)


def test_dapo_overlong_penalty_hand_computed() -> None:
    # L_max 10, buffer 4: no penalty up to 6 tokens, then (6 - len) / 4, and -1 past 10
    assert [overlong_penalty(n, 10, 4) for n in (6, 8, 10, 11)] == [0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(500, 0, 0) == 0.0  # off
    assert longest_reply([1, 1, 0, 0, 1, 1, 1, 0, 1]) == 3  # the longest single reply of a multi-turn sample


def test_dapo_overlong_penalty_shapes_the_advantage_not_the_reward() -> None:
    def played(reply: int) -> Rollout:
        sample = SimpleNamespace(token_ids=[0] * (3 + reply), loss_mask=[0, 0, 0] + [1] * reply,
                                 rollout_logprobs=[0.0] * (3 + reply))
        return Rollout(reward=1.0, group=("train", 0, "agent"), sample=sample)

    group = [played(5), played(8)]  # equal rewards; the second reply is 2 tokens into the 4-token buffer
    dapo = Algorithm.of(loss="dapo", overlong_max_tokens=10, overlong_buffer=4)
    items, adv = items_from(group, algorithm=dapo)
    assert adv.tolist() == pytest.approx([1.0, -1.0], abs=1e-5)  # rewards 1.0 and 0.5, group-normalized
    assert [p.reward for p in group] == [1.0, 1.0]
    assert items_from(group, algorithm=Algorithm.of())[1].tolist() == [0.0, 0.0]  # grpo: a tie, no signal


def test_kl_estimators_k1_and_k3() -> None:
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0]])  # log(pi / ref) = 0.5, 0
    assert kl_estimate(lp, ref, "k1").flatten().tolist() == pytest.approx([0.5, 0.0])
    assert kl_estimate(lp, ref, "k3").flatten().tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, 0.0])
    mask = torch.ones(1, 2)
    out = policy_loss(lp, lp.detach(), torch.tensor([0.0]), mask, ref_logprobs=ref, kl_coef=0.5, kl_estimator="k1")
    assert out.kl == pytest.approx(0.25)  # token mean of k1
    assert out.loss.item() == pytest.approx(0.5 * 0.25)
    out.loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([0.25, 0.25])  # d/dp of 0.5 * (p - ref) / 2 tokens
    with pytest.raises(ValueError, match="kl estimator"):
        kl_estimate(lp, ref, "k2")


def test_entropy_term_and_its_value() -> None:
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]], requires_grad=True)
    logp, ent = logprobs_and_entropy(logits, torch.tensor([[0, 0]]))
    h = [math.log(2.0), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]
    assert ent.flatten().tolist() == pytest.approx(h)
    assert logp.flatten().tolist() == pytest.approx([math.log(0.5), math.log(0.75)])
    out = policy_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 2), entropy=ent, entropy_coef=0.1)
    assert out.entropy == pytest.approx(sum(h) / 2)
    assert out.loss.item() == pytest.approx(-0.1 * sum(h) / 2)  # a bonus: minimizing the loss raises entropy
    out.loss.backward()
    # dH/dz_i = -p_i (log p_i + H): the 0.75 token's gradient is positive, so a descent step lowers its logit
    assert logits.grad[0, 1, 0].item() == pytest.approx(0.1 / 2 * 0.75 * (math.log(0.75) + h[1]), rel=1e-5)
    _, logged = logprobs_and_entropy(logits, torch.tensor([[0, 0]]), entropy_grad=False)
    assert not logged.requires_grad


def test_truncated_importance_weights_against_the_engine() -> None:
    q = torch.tensor([[-1.1, -2.0, -0.9]])  # the engine's logprobs
    lp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)  # the learner's, at the rollout's weights
    mask = torch.ones(1, 3)
    w = [math.exp(0.1), 2.0, math.exp(-0.1)]  # min(e^(p - q), 2): the middle token is cut from e^1
    out = policy_loss(lp, q, torch.tensor([1.0]), mask, tis_cap=2.0)
    assert out.loss.item() == pytest.approx(-sum(w) / 3, rel=1e-6)  # ratio 1 (against the learner's old p)
    assert out.tis_weight == pytest.approx(sum(w) / 3, rel=1e-6)
    assert out.tis_clipped == pytest.approx(1 / 3)
    assert out.logprob_gap_mean == pytest.approx((0.1 + 1.0 + 0.1) / 3, rel=1e-5)
    assert out.logprob_gap_max == pytest.approx(1.0, rel=1e-5)  # the middle token's |p - q|
    assert out.clip_fraction == 0.0
    out.loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-x / 3 for x in w], rel=1e-6)
    # gspo: one weight per sequence, min(e^(mean(p - q)), 2) = e^(1/3)
    seq = policy_loss(lp, q, torch.tensor([1.0]), mask, loss="gspo", tis_cap=2.0)
    assert seq.tis_weight == pytest.approx(math.exp(1 / 3), rel=1e-6)
    assert seq.loss.item() == pytest.approx(-math.exp(1 / 3), rel=1e-6)


def test_tis_matches_the_plain_ratio_where_the_clip_does_not_bind() -> None:
    torch.manual_seed(0)
    lp = torch.randn(3, 4, requires_grad=True)
    q = lp.detach() + 0.05 * torch.randn(3, 4)  # engine and learner differ a little (ratios within the clip)
    mask = (torch.rand(3, 4) > 0.2).long()
    adv = torch.randn(3)
    plain = policy_loss(lp, q, adv, mask)
    (g_plain,) = torch.autograd.grad(plain.loss, lp)
    tis = policy_loss(lp, q, adv, mask, tis_cap=2.0)
    (g_tis,) = torch.autograd.grad(tis.loss, lp)
    assert plain.clip_fraction == 0.0 and tis.tis_clipped == 0.0
    assert tis.loss.item() == pytest.approx(plain.loss.item(), rel=1e-6)
    assert torch.allclose(g_plain, g_tis, atol=1e-7)


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_every_loss_adds_up_over_micro_batches(loss: str) -> None:
    torch.manual_seed(1)
    lp = torch.randn(4, 5, requires_grad=True)
    q = lp.detach() + 0.1 * torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).long()
    mask[:, 0] = 1
    adv = torch.randn(4)
    kw = {"loss": loss, "tis_cap": 2.0, "norm_tokens": 7, "clip_low": 0.2, "clip_high": 0.28}
    (g_full,) = torch.autograd.grad(policy_loss(lp, q, adv, mask, **kw).loss, lp)
    n = int(mask.sum())
    parts = [policy_loss(lp[i:i + 2], q[i:i + 2], adv[i:i + 2], mask[i:i + 2], normalizer=n, num_samples=4, **kw)
             for i in (0, 2)]
    (g_parts,) = torch.autograd.grad(parts[0].loss + parts[1].loss, lp)
    assert torch.allclose(g_full, g_parts, atol=1e-6)
