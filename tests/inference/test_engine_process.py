"""The embedded engine in its own process (`inference.process=true`): the same answers as in this process,
weights pushed through a saved folder, a dead child named at once, and no child left after close."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.engines.completion import EngineUnavailable
from agentrl.inference.engines.embedded.process import ProcessEngine, embedded_engine

PROMPT = [5, 17, 42, 9, 100, 3]


def reference_logprobs(model, prompt: list[int], out: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1].gather(1, torch.tensor(out)[:, None])[:, 0]


async def test_the_child_samples_takes_new_weights_and_is_gone_after_close(random_model):
    old = AutoModelForCausalLM.from_pretrained(random_model).eval()
    new = AutoModelForCausalLM.from_pretrained(random_model).eval()
    with torch.no_grad():
        new.lm_head.weight.mul_(-1.0)
    eng = embedded_engine(random_model, process=True, process_threads=1)
    assert isinstance(eng, ProcessEngine) and eng.pid != os.getpid()
    try:
        first = await eng.generate(PROMPT, max_tokens=12, ignore_eos=True)
        assert first.weight_version == 0 and first.token_versions == [0] * 12
        assert torch.allclose(torch.tensor(first.logprobs), reference_logprobs(old, PROMPT, first.token_ids), atol=1e-4)
        version = await asyncio.to_thread(eng.update_weights, {k: v.clone() for k, v in new.state_dict().items()},
                                          mode="keep")
        assert version == 1 == eng.weight_version
        after = await eng.generate(PROMPT, max_tokens=12, ignore_eos=True)
        assert after.weight_version == 1
        assert torch.allclose(torch.tensor(after.logprobs), reference_logprobs(new, PROMPT, after.token_ids), atol=1e-4)
        with pytest.raises(ValueError, match="max_tokens must be >= 1"):
            await eng.generate(PROMPT, max_tokens=0)
        stats = eng.stats
        assert stats.requests == 2 and 0.0 <= stats.idle_fraction() <= 1.0
    finally:
        eng.close()
    assert not eng._proc.is_alive() and eng._proc.exitcode is not None  # noqa: SLF001
    with pytest.raises(EngineUnavailable, match="closed"):
        await eng.generate(PROMPT, max_tokens=3)


async def test_a_killed_child_is_named_to_every_caller(random_model):
    eng = ProcessEngine(random_model, threads=1)
    try:
        os.kill(eng.pid, signal.SIGKILL)
        eng._proc.join(60)  # noqa: SLF001
        for _ in range(600):  # the pipe reader notices the closed pipe; a loaded box may take a while
            if eng.failure is not None:
                break
            await asyncio.sleep(0.1)
        assert eng.failure is not None and "exited with code -9" in str(eng.failure)
        with pytest.raises(EngineUnavailable, match=f"pid {eng.pid}"):
            await eng.generate(PROMPT, max_tokens=3)
    finally:
        eng.close()


def test_a_lora_adapter_reaches_the_child(tmp_path):
    from agentrl.config.model import LoraConfig, ModelConfig
    from agentrl.inference.engines.embedded.engine import EmbeddedEngine
    from agentrl.testing.tiny_models import shared_tiny_model
    from agentrl.trainers.common.trained_model import load_trained_model
    from agentrl.trainers.grpo.learner import Learner

    path = shared_tiny_model()
    lora = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
    model = load_trained_model(path, ModelConfig(_target_="agentrl.models.hf.local_model", path=path, lora=lora))
    with torch.no_grad():  # a trained adapter, large enough to change the greedy reply
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0.0, 0.3 if "lora_B" in name else 0.5)
    learner = Learner(model, lr=1e-3, lora=lora)
    with EmbeddedEngine(path) as here, ProcessEngine(path, threads=1) as child:
        before = asyncio.run(child.generate(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True)).token_ids
        learner.push(here)
        learner.push(child)
        assert child.weight_version == 1 and learner.pushed_bytes > 0
        want = asyncio.run(here.generate(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True))
        got = asyncio.run(child.generate(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True))
    assert got.token_ids == want.token_ids != before
    assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4)


def test_the_session_server_runs_in_the_child_and_goes_with_it(random_model):
    """`serve_sessions`: a chat turn through the child's own session server; kill the child and its port refuses
    (an in-parent server would still answer, with a 503)."""
    import httpx

    from agentrl.play.services import serve_sessions

    eng = ProcessEngine(random_model, threads=1)
    try:
        server = serve_sessions(eng, port=0, default_max_tokens=8)
        sid = httpx.post(f"{server.base_url}/sessions", timeout=60).json()["session_id"]
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 1}
        turn = httpx.post(f"{server.base_url}/sessions/{sid}/v1/chat/completions", json=body, timeout=120)
        assert turn.status_code == 200, turn.text
        assert turn.json()["usage"]["completion_tokens"] >= 1
        records = httpx.get(f"{server.base_url}/sessions/{sid}", timeout=60).json()["records"]
        assert len(records) == 1
        assert eng.stats.requests == 1  # the turn reached the child's engine
        os.kill(eng.pid, signal.SIGKILL)
        eng._proc.join(60)  # noqa: SLF001
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.base_url}/health", timeout=10)
    finally:
        eng.close()
