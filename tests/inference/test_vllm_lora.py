"""LoRA adapters pushed to a real vLLM server (vLLM's CPU build, in the venv of scripts/install_vllm.sh).

One server for the module, launched with `lora` (the engine then passes --enable-lora and turns on the runtime
adapter routes). The adapters are PEFT's own (`get_peft_model` + `get_peft_model_state_dict`) and the reference
is PEFT's forward pass: after a push vLLM samples what base + adapter gives, not what the base gives, and what the
push wrote is the adapter alone (its bytes, not the model's). A second push replaces the first; a wrong adapter
fails naming what is wrong and the server keeps serving; an engine started on an adapter folder (a LoRA run's
checkpoint) serves base + adapter. Skipped as tests/inference/test_vllm.py is: only without a vLLM venv.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch

from agentrl.config.model import LoraConfig
from tests.inference.conftest import _config, build_tokenizer, needs_vllm

pytestmark = [pytest.mark.slow, needs_vllm()]

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen3 (head_dim 32, vLLM's CPU attention has no 16) with a peaky head."""
    from transformers import Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("lora_base")
    tok = build_tokenizer(folder)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(_config(len(tok), 64, 2, head_dim=32))
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(folder)
    return folder


def peft_model(base: Path, seed: int):
    """PEFT's LoRA on the base, B drawn at random (PEFT starts it at zero, which would change nothing)."""
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(model, PeftLora(r=LORA.rank, lora_alpha=LORA.alpha, lora_dropout=0.0,
                                          target_modules=list(LORA.target_modules)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return peft.eval()


def adapter_of(model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def reference_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """The model's log_softmax of each of `tokens` after PROMPT (teacher-forced)."""
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def served(base: Path, tmp_path_factory: pytest.TempPathFactory):
    from agentrl.inference.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(base, max_model_len=512, health_every_s=0.5, lora=LORA,
                        log_dir=tmp_path_factory.mktemp("vllm_lora_logs"))
    yield engine
    engine.close()


def _greedy(engine):
    return asyncio.run(engine.generate(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True))


def _served_names(engine) -> set[str]:
    return {m["id"] for m in httpx.get(f"{engine.urls[0]}/v1/models", trust_env=False).json()["data"]}


def test_the_launch_command_enables_lora_at_a_rank_vllm_accepts(served) -> None:
    argv = served._servers[served.urls[0]].argv
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "8"  # rank 4 rounds up to 8
    assert served._servers[served.urls[0]].env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_an_adapter_push_samples_base_plus_adapter_and_sends_only_the_adapter(served, base) -> None:
    before = _greedy(served)
    model = peft_model(base, seed=1)
    adapter = adapter_of(model)
    version = served.update_adapter(adapter, LORA)
    assert version == before.weight_version + 1 == served.weight_version
    held = httpx.get(f"{served.urls[0]}/weight_info", trust_env=False).json()["weight_version"]
    assert held == str(version)  # read back from the server, not assumed
    after = _greedy(served)
    assert after.weight_version == version and after.token_ids != before.token_ids
    # What vLLM sampled is PEFT's base + adapter: its logprobs are PEFT's forward pass on the same ids.
    peft_lp = reference_logprobs(model, after.token_ids)
    assert (torch.tensor(after.logprobs) - peft_lp).abs().max().item() < 1e-3, (after.logprobs, peft_lp)
    with model.disable_adapter():  # and not the base's
        base_lp = reference_logprobs(model, after.token_ids)
    assert (torch.tensor(after.logprobs) - base_lp).abs().max().item() > 0.1
    # The bytes the push wrote for the servers are the adapter's: its tensors plus a small config, not the model.
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    model_bytes = (base / "model.safetensors").stat().st_size
    assert adapter_bytes <= served.last_push_bytes < adapter_bytes + 16_384
    assert served.last_push_bytes < model_bytes / 4
    assert _served_names(served) >= {f"agentrl-lora-v{version}"}


def test_a_second_push_replaces_the_first(served, base) -> None:
    served.update_adapter(adapter_of(peft_model(base, seed=1)), LORA)
    first = _served_names(served)
    model = peft_model(base, seed=2)
    version = served.update_adapter(adapter_of(model), LORA)
    after = _greedy(served)
    assert after.weight_version == version
    peft_lp = reference_logprobs(model, after.token_ids)
    assert (torch.tensor(after.logprobs) - peft_lp).abs().max().item() < 1e-3
    names = _served_names(served)
    assert f"agentrl-lora-v{version}" in names
    assert f"agentrl-lora-v{version - 1}" in first and f"agentrl-lora-v{version - 1}" not in names  # unloaded


def test_a_wrong_adapter_fails_naming_it_and_the_server_keeps_serving(served, base) -> None:
    adapter = adapter_of(peft_model(base, seed=3))
    version = served.weight_version
    with pytest.raises(ValueError, match="model.lora.rank is 8"):
        served.update_adapter(adapter, LoraConfig(enabled=True, rank=8))
    whole = {**adapter, "model.norm.weight": torch.ones(64)}
    with pytest.raises(ValueError, match="not LoRA weights.*model.norm.weight"):
        served.update_adapter(whole, LORA)
    assert served.weight_version == version and _greedy(served).weight_version == version


def test_an_engine_on_an_adapter_folder_serves_base_plus_adapter(served, base, tmp_path: Path) -> None:
    """A LoRA run's checkpoint is an adapter folder naming its base: attached to the running server, the engine
    loads the base there and samples with the adapter from version 0."""
    from agentrl.inference.engines.vllm.engine import VLLMEngine

    model = peft_model(base, seed=4)
    model.save_pretrained(tmp_path / "ckpt")  # PEFT's own folder: adapter_config.json names the base
    # no `lora` given, as `agentrl eval` of a LoRA run's final model builds it: the folder's own settings are used
    # (what a launched server's --enable-lora / --max-lora-rank come from)
    attached = VLLMEngine(tmp_path / "ckpt", urls=served.urls, health_every_s=0.5)
    try:
        assert attached.model_path == base and attached.weight_version == 0
        assert attached.lora is not None and attached.lora.rank == LORA.rank
        assert attached.lora.target_modules == sorted(LORA.target_modules)
        done = _greedy(attached)
        peft_lp = reference_logprobs(model, done.token_ids)
        assert (torch.tensor(done.logprobs) - peft_lp).abs().max().item() < 1e-3
    finally:
        attached.close()  # not its server: it keeps running
