"""The embedded engine's decode path: the preallocated KV cache written in place, the shared prompt prefix run once,
and the inverse-CDF sampler give what a plain forward pass and the distribution say."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.engines.embedded import kv_cache
from agentrl.inference.engines.embedded.batch import inverse_cdf
from agentrl.inference.engines.embedded.engine import EmbeddedEngine, shared_prefix

PREFIX = [(11 * j) % 200 + 3 for j in range(40)]  # a "system prompt" every chat below opens with
TAILS = [[(5 * i + j) % 230 + 2 for j in range(2 + 3 * i)] for i in range(5)]


def reference_logprobs(model, prompt: list[int], out: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(out)[:, None])[:, 0]


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens, each from a fresh forward pass over everything so far (no cache)."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([prompt + out])).logits[0, -1].argmax()))
    return out


async def test_greedy_tokens_match_plain_forward_passes_as_rows_join_leave_and_outgrow_the_cache(random_model):
    """Rows join a running batch (a new cache built around them), leave it at different lengths (the cache
    re-selected and trimmed), and one outlives the spare columns it was built with (the buffers grow): every
    row's greedy tokens and logprobs are those of a fresh forward pass."""
    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()
    prompts = [PREFIX[: 5 + 4 * i] + TAILS[i % 5] for i in range(6)]
    lengths = [3, 20, 7, 140, 11, 30]  # 140 > kv_cache.GROW: a row admitted later asks for more room than was left
    with EmbeddedEngine(random_model, batch_wait_ms=20) as eng:
        async def one(i: int):
            await asyncio.sleep(0.01 * (i % 3))
            return await eng.generate(prompts[i], max_tokens=lengths[i], temperature=0.0, ignore_eos=True)

        got = await asyncio.gather(*[one(i) for i in range(6)])
        assert eng.stats.max_batch_size > 1
    for i, c in enumerate(got):
        assert c.token_ids == greedy(ref, prompts[i], lengths[i]), i
        expect = reference_logprobs(ref, prompts[i], c.token_ids, 1.0)
        assert torch.allclose(torch.tensor(c.logprobs), expect, atol=1e-4), i


async def test_prompts_that_open_alike_run_their_shared_prefix_once(random_model):
    """Five chats opening with one 40-token prefix (one of them sent three times): the prefix runs once, a later
    batch takes it from the prefix cache (runs it not at all), and each request's tokens and logprobs are still
    those of its own fresh forward pass."""
    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()
    prompts = [PREFIX + t for t in TAILS] + [PREFIX + TAILS[2]] * 2
    with EmbeddedEngine(random_model, batch_wait_ms=200) as eng:
        sampled = await asyncio.gather(*[eng.generate(p, max_tokens=9, temperature=1.1, ignore_eos=True)
                                         for p in prompts])
        s = eng.stats
        assert (s.prefill_passes, s.prefill_rows, s.shared_prefix_tokens) == (1, 5, 40 * 4)
        for p, c in zip(prompts, sampled, strict=True):
            assert torch.allclose(torch.tensor(c.logprobs), reference_logprobs(ref, p, c.token_ids, 1.1), atol=1e-4)
        greedy_replies = await asyncio.gather(*[eng.generate(p, max_tokens=6, temperature=0.0, ignore_eos=True)
                                                for p in prompts[:5]])
        assert eng.stats.shared_prefix_tokens == 40 * 4 + 40 * 5
    for p, c in zip(prompts[:5], greedy_replies, strict=True):
        assert c.token_ids == greedy(ref, p, 6)


def test_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    assert shared_prefix([(1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 9)]) == 2
    assert shared_prefix([(1, 2, 3), (1, 2, 3, 4, 5)]) == 2  # the shorter prompt keeps its last token
    assert shared_prefix([(7, 1), (8, 1)]) == 0


def _kv(rows: int, width: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 2, width, 4, generator=g), torch.randn(rows, 2, width, 4, generator=g))
            for _ in range(3)]


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([t.new_zeros(t.shape[0], t.shape[1], width - t.shape[2], t.shape[3]), t], dim=2)


def test_slab_cache_builds_appends_in_place_grows_trims_and_selects():
    old, new = _kv(2, 5, 0), _kv(2, 3, 1)
    rows = torch.tensor([1, 1, 0])
    cache = kv_cache.build([(old, None), (new, rows)], headroom=2)
    for (ok, ov), (nk, nv), layer in zip(old, new, cache.layers, strict=True):
        assert torch.equal(layer.keys, torch.cat([ok, _left_pad(nk[rows], 5)]))
        assert torch.equal(layer.values, torch.cat([ov, _left_pad(nv[rows], 5)]))
    expect = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    buffers = [layer.k_buf for layer in cache.layers]
    for step in range(4):  # two steps fit in the spare columns, the third grows the buffers
        add = _kv(5, 1, 10 + step)
        for i, layer in enumerate(cache.layers):
            k, v = layer.update(*add[i])
            expect[i] = (torch.cat([expect[i][0], add[i][0]], dim=2), torch.cat([expect[i][1], add[i][1]], dim=2))
            assert torch.equal(k, expect[i][0]) and torch.equal(v, expect[i][1])
        if step < 2:
            assert all(layer.k_buf is b for layer, b in zip(cache.layers, buffers, strict=True))  # in place
    assert cache.layers[0].k_buf.shape[2] >= 9 + kv_cache.GROW - 1 and cache.get_seq_length() == 9
    picked = kv_cache.select(cache, torch.tensor([0, 3]), 3, headroom=4)
    assert picked.get_seq_length() == 6 and picked.layers[0].k_buf.shape[2] == 10
    assert torch.equal(picked.layers[2].values, expect[2][1][[0, 3], :, 3:])


def test_inverse_cdf_draws_from_each_rows_distribution():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 2.0, 0.0, 2.0]])  # rows need not sum to one
    assert inverse_cdf(probs, torch.tensor([0.0, 0.0])).tolist() == [0, 1]
    assert inverse_cdf(probs, torch.tensor([1 - 1e-12, 0.5])).tolist() == [3, 3]  # zero mass is never drawn
    u = torch.rand(40_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    drawn = inverse_cdf(probs[:1].expand(len(u), -1), u)
    freq = torch.bincount(drawn, minlength=4).double() / len(u)
    assert torch.allclose(freq, torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=torch.float64), atol=0.01)
    with pytest.raises(RuntimeError, match="probability tensor"):  # NaN weights fail the worker, named
        inverse_cdf(torch.tensor([[0.5, float("nan")]]), torch.tensor([0.3]))


@pytest.mark.parametrize("vocab", [4, 256, 1000, 49_152])
def test_inverse_cdf_in_blocks_draws_what_one_float64_cumsum_draws(vocab):
    """The two-level search (block sums, then inside a block) picks the token a flat float64 cumsum picks, never one
    of zero mass, at vocabularies that do and do not fill their last block."""
    g = torch.Generator().manual_seed(vocab)
    probs = torch.softmax(4 * torch.randn(16, vocab, generator=g), dim=-1)
    probs[:, 1::3] = 0.0
    for _ in range(50):
        u = torch.rand(16, generator=g, dtype=torch.float64)
        cdf = probs.to(torch.float64).cumsum(-1)
        flat = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=vocab - 1)
        drawn = inverse_cdf(probs, u)
        assert torch.equal(drawn, flat)
        assert bool((probs.gather(1, drawn[:, None]) > 0).all())
