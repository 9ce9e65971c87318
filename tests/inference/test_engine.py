"""EmbeddedEngine: logprobs, batching, stops, weight updates, errors."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.engines.embedded.engine import EmbeddedEngine

PROMPTS = [[(7 * i + j) % 250 + 1 for j in range(4 + 3 * i)] for i in range(8)]


def reference_logprobs(model, prompt: list[int], out: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at the sampled tokens, from a fresh unbatched forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(out)[:, None])[:, 0]


@pytest.fixture
def engine(random_model):
    eng = EmbeddedEngine(random_model, batch_wait_ms=50)
    yield eng
    eng.close()


async def test_logprobs_equal_fresh_forward_pass(engine, random_model):
    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()

    async def staggered(i: int):
        await asyncio.sleep(0.004 * i)  # later requests join the running batch between decode steps
        t = 0.7 if i % 2 else 1.3
        kw = {"top_k": 20, "top_p": 0.9} if i % 3 == 0 else {}
        return t, await engine.generate(PROMPTS[i], max_tokens=6 + i, temperature=t, ignore_eos=True, **kw)

    results = await asyncio.gather(*[staggered(i) for i in range(8)])
    for i, (t, c) in enumerate(results):
        assert len(c.token_ids) == len(c.logprobs) == 6 + i and c.finish_reason == "length"
        expect = reference_logprobs(ref, PROMPTS[i], c.token_ids, t)
        assert torch.allclose(torch.tensor(c.logprobs), expect, atol=1e-4), (i, c.logprobs, expect)
    assert engine.stats.max_batch_size > 1


async def test_greedy_logprobs_use_temperature_one(engine, random_model):
    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()
    c = await engine.generate(PROMPTS[0], max_tokens=5, temperature=0.0, ignore_eos=True)
    expect = reference_logprobs(ref, PROMPTS[0], c.token_ids, 1.0)
    assert torch.allclose(torch.tensor(c.logprobs), expect, atol=1e-4)
    with torch.no_grad():
        first = ref(torch.tensor([PROMPTS[0]])).logits[0, -1].argmax().item()
    assert c.token_ids[0] == first


async def test_eight_concurrent_requests_share_one_batch(engine):
    results = await asyncio.gather(
        *[engine.generate(p, max_tokens=10, ignore_eos=True) for p in PROMPTS]
    )
    assert all(len(r.token_ids) == 10 for r in results)
    s = engine.stats
    assert (s.prefill_passes, s.decode_steps, s.max_batch_size, s.busy_periods) == (1, 9, 8, 1)
    assert s.tokens_generated == 80 and s.requests == 8


async def test_a_prompt_sent_many_times_at_once_is_prefilled_once(engine, random_model):
    """A GRPO group: one prompt n times (plus another prompt) in one batch runs 2 prompt rows, and each request
    still decodes on its own: its logprobs match a fresh forward pass and a seeded one samples what it samples
    alone."""
    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()
    prompts = [PROMPTS[3]] * 6 + [PROMPTS[5]] * 2
    together = await asyncio.gather(*[engine.generate(p, max_tokens=8, temperature=1.2, seed=40 + i, ignore_eos=True)
                                      for i, p in enumerate(prompts)])
    s = engine.stats
    assert (s.prefill_passes, s.prefill_rows, s.max_batch_size) == (1, 2, 8)
    assert len({tuple(c.token_ids) for c in together[:6]}) > 1  # six copies of one row, sampled apart
    for i, (p, c) in enumerate(zip(prompts, together, strict=True)):
        expect = reference_logprobs(ref, p, c.token_ids, 1.2)
        assert torch.allclose(torch.tensor(c.logprobs), expect, atol=1e-4), (i, c.logprobs, expect)
    alone = await engine.generate(prompts[4], max_tokens=8, temperature=1.2, seed=44, ignore_eos=True)
    assert alone.token_ids == together[4].token_ids


async def test_seed_reproduces_a_sample(engine):
    a = await engine.generate(PROMPTS[2], max_tokens=12, seed=123, ignore_eos=True)
    b = await engine.generate(PROMPTS[2], max_tokens=12, seed=123, ignore_eos=True)
    c = await engine.generate(PROMPTS[2], max_tokens=12, seed=124, ignore_eos=True)
    assert a.token_ids == b.token_ids
    assert c.token_ids != a.token_ids


async def test_stops_at_im_end_and_counts_it(scripted):
    folder = scripted("The answer is 3.")
    tok = AutoTokenizer.from_pretrained(folder)
    prompt = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    with EmbeddedEngine(folder) as eng:
        c = await eng.generate(prompt, max_tokens=50)
        assert c.finish_reason == "stop"
        assert tok.decode(c.token_ids) == "The answer is 3.<|im_end|>"
        short = await eng.generate(prompt, max_tokens=1)
        assert short.finish_reason == "length" and len(short.token_ids) == 1
        # an explicit stop id ends the reply at that token
        stop = await eng.generate(prompt, max_tokens=50, stop_ids=c.token_ids[:1])
        assert stop.token_ids == c.token_ids[:1] and stop.finish_reason == "stop"


async def test_weight_update_applies_to_next_request_not_running_one(random_model):
    old = AutoModelForCausalLM.from_pretrained(random_model).eval()
    new = AutoModelForCausalLM.from_pretrained(random_model).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        new.lm_head.weight.add_(torch.randn_like(new.lm_head.weight))
    with EmbeddedEngine(random_model) as eng:
        running = asyncio.ensure_future(eng.generate(PROMPTS[1], max_tokens=80, ignore_eos=True))
        while eng.stats.decode_steps < 2:
            await asyncio.sleep(0.001)
        version = await asyncio.to_thread(eng.update_weights, {k: v.clone() for k, v in new.state_dict().items()})
        first = await running
        assert version == 1 == eng.weight_version
        assert first.weight_version == 0 and len(first.token_ids) == 80
        assert torch.allclose(torch.tensor(first.logprobs), reference_logprobs(old, PROMPTS[1], first.token_ids, 1.0),
                              atol=1e-4)
        nxt = await eng.generate(PROMPTS[1], max_tokens=10, ignore_eos=True)
        assert nxt.weight_version == 1
        got = torch.tensor(nxt.logprobs)
        assert torch.allclose(got, reference_logprobs(new, PROMPTS[1], nxt.token_ids, 1.0), atol=1e-4)
        assert not torch.allclose(got, reference_logprobs(old, PROMPTS[1], nxt.token_ids, 1.0), atol=1e-2)


def test_weight_update_from_folder_and_bad_state_dicts(random_model, tmp_path):
    new = AutoModelForCausalLM.from_pretrained(random_model)
    with torch.no_grad():
        new.model.norm.weight.mul_(2.0)
    new.save_pretrained(tmp_path)
    with EmbeddedEngine(random_model) as eng:
        assert eng.update_weights(tmp_path) == 1
        assert torch.equal(eng.model.model.norm.weight, new.model.norm.weight)
        with pytest.raises(ValueError, match="unknown parameter"):
            eng.update_weights({"no.such.weight": torch.zeros(1)})
        with pytest.raises(ValueError, match="shape"):
            eng.update_weights({"model.norm.weight": torch.zeros(3)})
        assert eng.weight_version == 1  # refused updates leave the version alone


async def test_bad_requests_raise_value_error(engine):
    for kwargs, match in [
        ({"prompt_ids": [], "max_tokens": 3}, "empty"),
        ({"prompt_ids": [1, 10**6], "max_tokens": 3}, "must lie in"),
        ({"prompt_ids": [1] * 1024, "max_tokens": 3}, "no room"),
        ({"prompt_ids": [1], "max_tokens": 0}, "max_tokens"),
        ({"prompt_ids": [1], "max_tokens": 3, "top_p": 0.0}, "top_p"),
        ({"prompt_ids": [1], "max_tokens": 3, "temperature": -1.0}, "temperature"),
    ]:
        with pytest.raises(ValueError, match=match):
            await engine.generate(**kwargs)
    # the context caps max_tokens rather than overflowing it
    c = await engine.generate([1] * 1020, max_tokens=50, ignore_eos=True)
    assert len(c.token_ids) == 4 and c.finish_reason == "length"


async def test_close_fails_waiting_requests(random_model):
    eng = EmbeddedEngine(random_model)
    pending = asyncio.ensure_future(eng.generate(PROMPTS[0], max_tokens=400, ignore_eos=True))
    while eng.stats.decode_steps < 1:
        await asyncio.sleep(0.001)
    closer = threading.Thread(target=eng.close)
    closer.start()
    done = await pending  # a running request finishes before the worker stops
    assert len(done.token_ids) == 400
    closer.join()
    with pytest.raises(RuntimeError, match="closed"):
        await eng.generate(PROMPTS[0], max_tokens=2)


def test_a_closed_engine_lets_its_weights_go_and_refuses_a_push(random_model) -> None:
    import gc
    import weakref

    from agentrl.inference.engines.embedded.engine import EngineUnavailable

    engine = EmbeddedEngine(random_model)
    weights = weakref.ref(engine.model)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.close()
    keeper = [engine]  # still referenced, as a stopped session app's closures keep one
    gc.collect()
    assert weights() is None
    with pytest.raises(EngineUnavailable, match="closed"):
        keeper[0].update_weights(state)
