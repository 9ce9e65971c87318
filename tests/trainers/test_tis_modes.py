"""Importance sampling against the behaviour logprobs: truncated or masked, per token or per sequence
(`trainer.tis_mode`, `trainer.tis_level`), checked on the gradient each token receives."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.trainers.grpo.grpo_math import policy_loss

CAP = 2.0
# One sample, three model tokens. The learner's old logprobs (p_old) against the engine's (q): token 0 on
# policy (w = 1), token 1 w = e^0.5 ~ 1.65 (under the cap), token 2 w = e^1.5 ~ 4.48 (over it).
P_OLD = torch.tensor([[-1.0, -1.0, -1.0]])
Q = torch.tensor([[-1.0, -1.5, -2.5]])
MASK = torch.ones(1, 3)


def token_grads(q: torch.Tensor = Q, **kw) -> torch.Tensor:
    """d loss / d logprob per token, at logprobs = p_old (ratio 1: every token unclipped)."""
    logprobs = P_OLD.clone().requires_grad_(True)
    out = policy_loss(logprobs, q, torch.tensor([1.0]), MASK, tis_cap=CAP, behaviour_logprobs=P_OLD, **kw)
    out.loss.backward()
    return logprobs.grad[0]


def test_truncate_cuts_a_large_weight_to_the_cap():
    g = token_grads(tis_mode="truncate")
    w = -3 * g  # the loss is -mean_t(w_t * ratio_t * A): each token's gradient is -w_t / 3
    assert torch.allclose(w, torch.tensor([1.0, math.exp(0.5), CAP]), atol=1e-5)


def test_mask_drops_the_token_over_the_cap_and_keeps_the_others_uncut():
    g = token_grads(tis_mode="mask")
    w = -3 * g
    assert torch.allclose(w, torch.tensor([1.0, math.exp(0.5), 0.0]), atol=1e-5)


def test_sequence_level_gives_every_token_the_samples_one_weight():
    mean_gap = float((P_OLD - Q).mean())  # (0 + 0.5 + 1.5) / 3 = 2/3: e^(2/3) ~ 1.95, under the cap
    w = -3 * token_grads(tis_level="sequence")
    assert torch.allclose(w, torch.full((3,), math.exp(mean_gap)), atol=1e-5)
    # masked per sequence: under the cap the sample keeps its one weight on every token ...
    assert torch.allclose(-3 * token_grads(tis_mode="mask", tis_level="sequence"), w, atol=1e-5)
    # ... over it (mean gap 1: e^1 ~ 2.72 > 2) the whole sample leaves the loss, where truncation keeps it at the cap
    over = torch.tensor([[-1.0, -2.0, -3.0]])
    assert torch.equal(token_grads(over, tis_mode="mask", tis_level="sequence"), torch.zeros(3))
    assert torch.allclose(-3 * token_grads(over, tis_level="sequence"), torch.full((3,), CAP), atol=1e-5)


def test_ignore_trains_a_stale_sample_as_if_on_policy():
    # no weight on any token, and the ratio is to p_old, not q: with q far from p_old (a stale sample) every token
    # gets the on-policy gradient -1/3, where against q the ratio exp(p_old - q) would be clipped at 1 + 0.2
    g = token_grads(tis_mode="ignore")
    assert torch.allclose(-3 * g, torch.ones(3), atol=1e-6)
    for cap in (0.0, 1.0):  # whatever the cap, even 0 (which otherwise means "ratio to q")
        logprobs = P_OLD.clone().requires_grad_(True)
        out = policy_loss(logprobs, Q, torch.tensor([1.0]), MASK, tis_cap=cap, tis_mode="ignore",
                          behaviour_logprobs=P_OLD)
        out.loss.backward()
        assert torch.allclose(-3 * logprobs.grad[0], torch.ones(3), atol=1e-6)
        assert out.tis_weight == 0.0 and out.tis_clipped == 0.0
    assert token_grads(tis_mode="truncate")[2] != g[2]  # the corrected modes do weigh that token
    GRPOTrainerConfig(tis_cap=0.0, tis_mode="ignore")  # a valid setting with the cap off too


def test_mask_of_a_huge_gap_is_zero_not_nan():
    # exp(120) overflows float32 to inf; masking it must give weight 0, not inf * 0 = NaN
    g = token_grads(torch.tensor([[-1.0, -1.5, -121.0]]), tis_mode="mask")
    assert torch.isfinite(g).all()
    assert torch.allclose(-3 * g, torch.tensor([1.0, math.exp(0.5), 0.0]), atol=1e-5)


def test_modes_without_a_cap_are_refused():
    with pytest.raises(ValueError, match="tis_cap=0 turns off"):
        GRPOTrainerConfig(tis_cap=0.0, tis_mode="mask")
    with pytest.raises(ValueError, match="tis_cap=0 turns off"):
        GRPOTrainerConfig(tis_cap=0.0, tis_level="sequence")
    GRPOTrainerConfig(tis_cap=0.0)  # off, the defaults: fine


def test_unknown_modes_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="trainer.tis_mode='clip': choose one of truncate, mask, ignore"):
        GRPOTrainerConfig(tis_mode="clip")
    with pytest.raises(ValueError, match="trainer.tis_level='batch': choose one of token, sequence"):
        GRPOTrainerConfig(tis_level="batch")
    with pytest.raises(ValueError, match="tis_mode must be one of"):
        token_grads(tis_mode="nope")
