"""The embedded engine's prepacked linear layers (oneDNN's weight layout, float32 on a CPU): the same products as
F.linear, the same state dict, and new weights laid out again after every push."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.engines.embedded import packed_linear
from agentrl.inference.engines.embedded.engine import EmbeddedEngine

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch build has no oneDNN linear")


def test_packed_linear_multiplies_as_f_linear_keeps_the_state_dict_and_follows_new_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(576, 1536), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    keys = list(model.state_dict())
    assert packed_linear.pack_linears(model) == 1  # the 8 x 8 layer is too small to gain
    assert isinstance(model[0], packed_linear.PackedLinear) and type(model[2]) is torch.nn.Linear
    assert list(model.state_dict()) == keys
    x = torch.randn(3, 5, 576)  # a batch of rows x tokens, as a prefill sends
    expect = torch.nn.functional.linear(x, model[0].weight, model[0].bias)
    assert torch.allclose(model[0](x), expect, atol=1e-4, rtol=1e-5)
    with torch.no_grad():
        model.state_dict()["0.weight"].mul_(-2.0)  # a push copies into the parameter in place
    packed_linear.repack(model)
    assert torch.allclose(model[0](x), -2.0 * (expect - model[0].bias) + model[0].bias, atol=1e-3, rtol=1e-5)
    twin = copy.deepcopy(model)  # the packed copy is opaque to deepcopy: laid out anew
    assert torch.allclose(twin[0](x), model[0](x), atol=1e-5)


async def test_an_engine_with_every_linear_packed_samples_the_models_tokens_before_and_after_a_push(
        random_model, monkeypatch):
    """MIN_WEIGHTS lowered so that the small test model's layers are packed too: greedy tokens and logprobs are a
    fresh forward pass's, under the first weights and under pushed ones."""
    monkeypatch.setattr(packed_linear, "MIN_WEIGHTS", 0)
    old = AutoModelForCausalLM.from_pretrained(random_model).eval()
    new = copy.deepcopy(old)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompts = [[5 + i, 9, 11 + 2 * i, 3] for i in range(3)]
    with EmbeddedEngine(random_model, batch_wait_ms=50) as eng:
        assert sum(1 for _ in packed_linear.packed_layers(eng.model)) > 0

        async def replies():
            return await asyncio.gather(*[eng.generate(p, max_tokens=6, temperature=0.0, ignore_eos=True)
                                          for p in prompts])

        before = await replies()
        eng.update_weights(new.state_dict())
        after = await replies()
    for model, got in ((old, before), (new, after)):
        for p, c in zip(prompts, got, strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1].float()
            assert c.token_ids == logits.argmax(-1).tolist()
            logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), logp, atol=1e-4)
