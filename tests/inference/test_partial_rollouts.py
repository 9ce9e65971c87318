"""Partial rollouts in EmbeddedEngine: a push in keep mode lands between two decode steps of a running
reply, every token records the weight version that sampled it, and its logprob is that pass's."""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.sessions.samples import assemble_sample, is_resumed

PROMPT = [5, 17, 42, 9, 100, 3]
TEMPERATURE = 0.9


def perturbed(path) -> torch.nn.Module:
    """The same model with EVERY weight moved: the KV cache of the old weights differs from the new one's."""
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * p.std().clamp(min=0.05) * torch.randn_like(p))
    return model


def hold_at_decode_step(engine: EmbeddedEngine, step: int) -> threading.Event:
    """Hold the worker inside decode step `step`'s forward pass until a weight push is pending, so the push
    lands mid-reply however loaded the machine is. Returns an event set once the worker is held."""
    held = threading.Event()

    def hook(_module, _args):
        if held.is_set() or engine.stats.decode_steps < step:
            return
        held.set()
        while not engine._pending_weights:  # noqa: SLF001 - the push from the test thread is queued
            threading.Event().wait(0.001)

    held.handle = engine.model.register_forward_pre_hook(hook)  # type: ignore[attr-defined]
    return held


def push_when_held(engine: EmbeddedEngine, held: threading.Event, state: dict, **kw) -> int:
    held.wait()
    return engine.update_weights(state, **kw)


def expected_logprobs(old, new, prompt: list[int], out: list[int], switch: int) -> torch.Tensor:
    """log_softmax(logits / T) at each token as the engine computed it: tokens before `switch` from the old
    weights; later ones from the new weights reading the old weights' cache of everything before token
    `switch - 1` (that token was sampled by the old weights and first fed to the new ones)."""
    cache = "cache" if "cache" in inspect.signature(new.forward).parameters else "past_key_values"  # transformers 5
    with torch.no_grad():
        head = old(torch.tensor([prompt + out[: switch - 1]]), use_cache=True)
        before = head.logits[0, len(prompt) - 1 :].float()
        tail = new(torch.tensor([out[switch - 1 : -1]]), use_cache=True, **{cache: getattr(head, cache)})
        after = tail.logits[0].float()
    logits = torch.cat([before, after])
    logp = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    return logp.gather(1, torch.tensor(out)[:, None])[:, 0]


async def test_keep_push_mid_reply_records_two_versions_and_their_logprobs(random_model):
    old = AutoModelForCausalLM.from_pretrained(random_model).eval()
    new = perturbed(random_model)
    with EmbeddedEngine(random_model) as eng:
        held = hold_at_decode_step(eng, 3)
        running = asyncio.ensure_future(eng.generate(PROMPT, max_tokens=40, temperature=TEMPERATURE, ignore_eos=True))
        version = await asyncio.to_thread(push_when_held, eng, held,
                                          {k: v.clone() for k, v in new.state_dict().items()}, mode="keep")
        done = await running
        held.handle.remove()
    assert version == 1
    versions = done.token_versions
    switch = versions.index(1)
    # the push landed mid-reply: old tokens first, then new ones to the end, and the reply was not cut short
    assert len(done.token_ids) == 40 and 2 <= switch < 40
    assert versions == [0] * switch + [1] * (40 - switch)
    assert done.weight_version == 0  # staleness counts from the first token's version
    assert eng.stats.kept_pushes == 1 and eng.stats.resumed_requests == 1
    got = torch.tensor(done.logprobs)
    want = expected_logprobs(old, new, PROMPT, done.token_ids, switch)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    # the tokens after the push really were scored by other weights than the old ones
    stale = expected_logprobs(old, old, PROMPT, done.token_ids, switch)
    assert (got[switch:] - stale[switch:]).abs().max() > 1e-2


async def test_wait_push_lets_the_running_reply_finish_on_one_version(random_model):
    new = perturbed(random_model)
    with EmbeddedEngine(random_model) as eng:
        held = hold_at_decode_step(eng, 3)
        running = asyncio.ensure_future(eng.generate(PROMPT, max_tokens=40, ignore_eos=True))
        await asyncio.to_thread(push_when_held, eng, held, {k: v.clone() for k, v in new.state_dict().items()})
        done = await running
        held.handle.remove()
    assert done.token_versions == [0] * 40 and eng.stats.kept_pushes == 0 and eng.stats.resumed_requests == 0


def test_a_push_mode_that_does_not_exist_is_refused(random_model):
    with EmbeddedEngine(random_model) as eng:
        with pytest.raises(ValueError, match="mode must be one of wait, keep"):
            eng.update_weights({"model.norm.weight": eng.model.model.norm.weight.clone()}, mode="later")
        assert eng.weight_version == 0


def _record(prompt: list[int], out: list[int], versions: list[int]) -> dict:
    meta = {"output_token_logprobs": [[-0.5, t] for t in out], "weight_version": versions[0],
            "token_weight_versions": versions}
    return {"path": "/v1/chat/completions", "request": {"input_ids": prompt},
            "response": {"choices": [{"finish_reason": "stop", "meta_info": meta}]}}


def test_a_sample_counts_the_turns_a_push_landed_in():
    first = _record([1, 2], [3, 4], [4, 4])
    second = _record([1, 2, 3, 4, 9], [5, 6, 7], [4, 5, 5])  # the push landed inside this turn
    sample = assemble_sample([first, second])
    assert sample.metadata["weight_versions"] == [4, 4]
    assert sample.metadata["first_weight_version"] == 4 and sample.metadata["resumed_turns"] == 1
    assert is_resumed(sample)
    # a push between two turns is no resumed rollout: each turn has one version
    plain = assemble_sample([first, _record([1, 2, 3, 4, 9], [5, 6], [5, 5])])
    assert plain.metadata["resumed_turns"] == 0 and not is_resumed(plain)
