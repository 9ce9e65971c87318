"""The prompt prefix the engine's rows share: attended once (`prefix_attention`), kept between batches
(`prefix_cache`), and given back to the rows when a newcomer shares less of it. Every case checks the engine's
tokens and logprobs against fresh, unbatched forward passes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import types

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.engines.completion import Request
from agentrl.inference.engines.embedded import prefix_attention
from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.engines.embedded.prefix_cache import MIN_SHARED_PREFIX, PrefixCache, SharedPrefix

PREFIX = [(7 * j) % 190 + 5 for j in range(36)]  # every chat below opens with it (>= MIN_SHARED_PREFIX)
assert len(PREFIX) >= MIN_SHARED_PREFIX


def fresh(model, prompt: list[int], out: list[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of a fresh forward pass at each position of `prompt + out`, and `out`'s logprobs (T=1)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logits.argmax(-1).tolist(), logp.gather(1, torch.tensor(out)[:, None])[:, 0]


def reference_attention(q, pk, pv, k, v, visible, scale):
    """Softmax attention over [prefix, own columns] with GQA by repeat: [B, q, H, D]."""
    b, heads = q.shape[:2]
    rep = heads // k.shape[1]
    keys = torch.cat([pk.expand(b, -1, -1, -1), k], 2).repeat_interleave(rep, 1).float()
    values = torch.cat([pv.expand(b, -1, -1, -1), v], 2).repeat_interleave(rep, 1).float()
    seen = torch.cat([torch.ones(*visible.shape[:3], pk.shape[2], dtype=torch.bool), visible], -1)
    scores = (q.float() @ keys.transpose(-1, -2) * scale).masked_fill(~seen, float("-inf"))
    return (torch.softmax(scores, -1) @ values).transpose(1, 2)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("on_cpu_kernel", [True, False])
def test_prefix_attention_is_attention_over_prefix_and_row(dtype, atol, on_cpu_kernel, monkeypatch):
    """Both kernels (the CPU flash kernel, and the plain one used on other devices), for decode (q=1) and a prefill
    with padding rows (a query that sees none of its row's own columns sees only the prefix), with SDPA's mask and
    without it (causal)."""
    if not on_cpu_kernel:
        monkeypatch.setattr(prefix_attention, "attend", prefix_attention.attend_plain)
    g = torch.Generator().manual_seed(0)
    b, heads, kv_heads, p, t, d = 3, 4, 2, 7, 5, 8
    module = types.SimpleNamespace(layer_idx=1)
    pk, pv = (torch.randn(1, kv_heads, p, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, kv_heads, t, d, generator=g).to(dtype) for _ in range(2))
    for q_len in (1, 3):
        q = torch.randn(b, heads, q_len, d, generator=g).to(dtype)
        causal = torch.ones(q_len, t, dtype=torch.bool).tril(t - q_len)[None, None].expand(b, 1, -1, -1)
        padded = causal.clone()
        padded[1, :, :, :2] = False  # row 1: two padding columns
        padded[2, :, 0, :] = False  # row 2: its first query is padding
        for mask, visible in ((padded, padded), (None, causal)):
            out, _ = prefix_attention.prefix_attention(module, q, k, v, mask, scaling=d**-0.5,
                                                       shared_prefix=[None, (pk, pv)])
            expect = reference_attention(q, pk, pv, k, v, visible, d**-0.5)
            assert out.shape == (b, q_len, heads, d) and out.dtype == dtype
            assert torch.allclose(out.float(), expect, atol=atol), (q_len, mask is None)


def test_prefix_cache_reuses_what_a_new_prefix_opens_with_never_across_weight_versions():
    calls: list[tuple[tuple[int, ...], int]] = []

    def compute(ids, base):
        calls.append((tuple(ids), len(base) if base is not None else 0))
        n = len(ids) + (len(base) if base is not None else 0)
        return [(torch.arange(n, dtype=torch.float32).view(1, 1, n, 1),) * 2]

    cache = PrefixCache(compute)
    a = cache.get([1, 2, 3, 4], version=0)
    assert calls == [((1, 2, 3, 4), 0)] and len(a) == 4
    b = cache.get([1, 2, 3], version=0)  # a head of the kept prefix: nothing runs
    assert len(calls) == 1 and b.ids == (1, 2, 3) and b.kv[0][0].shape[2] == 3
    cache.get([1, 2, 9, 9], version=0)  # opens with two of its tokens: only the rest runs, after them
    assert calls[-1] == ((9, 9), 2) and cache.computed_tokens == 6
    cache.get([1, 2, 9, 9], version=1)  # new weights: all of it runs again
    assert calls[-1] == ((1, 2, 9, 9), 0)
    assert SharedPrefix((1, 2, 3), [], 0).shared_with(SharedPrefix((1, 2, 4), [], 0)) == 2
    assert SharedPrefix((1, 2, 3), [], 0).shared_with(SharedPrefix((1, 2, 3), [], 1)) == 0


def test_rows_keep_their_tokens_as_newcomers_share_less_of_the_prefix(random_model):
    """A group of one prompt starts the batch (its prefix: all but the prompt's last token); a chat sharing only
    PREFIX joins (the group's rows take back the columns they no longer share), then a chat sharing nothing
    (every row takes back all of it). The engine's steps are driven here, so each join happens mid-batch. Every
    row's greedy tokens and logprobs are a fresh forward pass's."""
    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()
    group, other, alone = PREFIX + [40, 41, 42, 43, 44], PREFIX + [50, 51], [60 + j for j in range(20)]
    reqs = [request(p, 12) for p in (group, group, other, alone)]
    with EmbeddedEngine(random_model) as eng, torch.inference_mode():
        eng._prefill(reqs[:2])
        assert len(eng._batch.prefix) == len(group) - 1  # the group's prefix, held once
        for _ in range(3):
            eng._decode_step()
        eng._prefill(reqs[2:3])
        assert len(eng._batch.prefix) == len(PREFIX) and len(eng._batch) == 3
        for _ in range(3):
            eng._decode_step()
        eng._prefill(reqs[3:])
        assert eng._batch.prefix is None and len(eng._batch) == 4
        while eng._batch:
            eng._decode_step()
    assert_fresh(ref, reqs)


def assert_fresh(ref, reqs: list[Request]) -> None:
    """Each finished request's tokens and logprobs are those of a fresh forward pass of `ref`."""
    for r in reqs:
        c = r.future.result(timeout=0)
        tokens, logprobs = fresh(ref, list(r.prompt_ids), c.token_ids)
        assert c.token_ids == tokens
        assert torch.allclose(torch.tensor(c.logprobs), logprobs, atol=1e-4)


def request(prompt: list[int], max_tokens: int) -> Request:
    return Request(prompt_ids=list(prompt), max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0,
                   stop_ids=frozenset(), generator=None, future=concurrent.futures.Future())


async def test_the_kept_prefix_is_recomputed_after_new_weights(random_model):
    """Two batches of chats opening alike, new weights between them: the second batch's replies are the new
    weights' (the kept prefix K/V was the old weights')."""
    old = AutoModelForCausalLM.from_pretrained(random_model).eval()
    new = AutoModelForCausalLM.from_pretrained(random_model).eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompts = [PREFIX + [70 + i, 71 + i] for i in range(3)]
    with EmbeddedEngine(random_model, batch_wait_ms=50) as eng:
        first = await asyncio.gather(*[eng.generate(p, max_tokens=8, temperature=0.0, ignore_eos=True)
                                       for p in prompts])
        shared_before = eng.stats.shared_prefix_tokens
        eng.update_weights(new.state_dict())
        second = await asyncio.gather(*[eng.generate(p, max_tokens=8, temperature=0.0, ignore_eos=True)
                                        for p in prompts])
        assert eng.stats.shared_prefix_tokens - shared_before == len(PREFIX) * 2  # run once again, not reused
    for model, replies in ((old, first), (new, second)):
        for p, c in zip(prompts, replies, strict=True):
            tokens, logprobs = fresh(model, p, c.token_ids)
            assert c.token_ids == tokens
            assert torch.allclose(torch.tensor(c.logprobs), logprobs, atol=1e-4)


def test_without_a_prefix_kept_apart_each_row_holds_its_own_copy(random_model):
    """As on a GPU (`share_prefix=False`): the prefix still comes from the prefix cache, but each row is prefilled
    with its own copy of it and the batch keeps none apart; tokens and logprobs are still a fresh pass's."""
    from agentrl.inference.engines.embedded.batch import DecodeBatch

    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()
    prompts = [PREFIX + [80, 81], PREFIX + [82, 83, 84], PREFIX + [80, 81]]
    reqs = [request(p, 8) for p in prompts]
    with EmbeddedEngine(random_model) as eng, torch.inference_mode():
        eng._batch = DecodeBatch(share_prefix=False)
        eng._prefill(reqs)
        assert eng._batch.prefix is None and eng.stats.shared_prefix_tokens == len(PREFIX)  # run once, 2 distinct
        while eng._batch:
            eng._decode_step()
    assert_fresh(ref, reqs)
