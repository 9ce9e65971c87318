"""model.lora in the built-in learner (issue 32), on a real tiny Qwen3 model with real PEFT: only the adapter
trains and sits in the optimizer, a push hands the embedded engine the adapter alone and changes what it samples,
a checkpoint restores adapter and optimizer exactly, and a target module the model lacks fails at plan time."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from agentrl.config.model import LoraConfig, ModelConfig
from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.testing.config import compose_config
from agentrl.testing.tiny_models import shared_tiny_model
from agentrl.trainers.common import lora, weight_push
from agentrl.trainers.common.trained_model import load_trained_model
from agentrl.trainers.grpo import checkpoint as ckpt
from agentrl.trainers.grpo.learner import Learner, TrainItem

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
PROMPT = [5, 17, 99, 230, 41, 8]


def model_settings(path: str, settings: LoraConfig = LORA) -> ModelConfig:
    return ModelConfig(_target_="agentrl.models.hf.local_model", path=path, lora=settings)


def items(seed: int = 0) -> list[TrainItem]:
    """Four samples with model tokens and opposite advantages: a real policy-gradient signal."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        ids = torch.randint(3, 1000, (14,), generator=g).tolist()
        mask = [0] * 6 + [1] * 8
        out.append(TrainItem(ids, mask, [-7.0] * 14, 1.0 if i % 2 else -1.0))
    return out


def learner_for(model: torch.nn.Module) -> Learner:
    return Learner(model, lr=5e-2, algorithm=None, micro_batch_samples=2, lora=LORA)


def adapter_params(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if ".lora_" in n}


def test_only_the_adapter_trains_and_sits_in_the_optimizer() -> None:
    path = shared_tiny_model()
    model = load_trained_model(path, model_settings(path))
    adapter = adapter_params(model)
    base = {n: p for n, p in model.named_parameters() if ".lora_" not in n}
    assert adapter and base
    assert {n.split(".")[-4] for n in adapter} == {"q_proj", "v_proj", "down_proj"}
    learner = learner_for(model)
    learner.step(items())
    # Step 1 trains B (A's gradient is B^T ... = 0 while B = 0); by step 2 every adapter matrix has a gradient.
    learner.step(items(1))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in adapter.values()), \
        [n for n, p in adapter.items() if p.grad is None or not p.grad.abs().sum()]
    assert all(p.grad is None and not p.requires_grad for p in base.values())
    # AdamW holds the adapter's parameters and a state for each, nothing of the base.
    held = [p for group in learner.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in held} == {id(p) for p in adapter.values()}
    state_numel = sum(t.numel() for s in learner.optimizer.state.values() for t in s.values() if t.dim() > 0)
    assert state_numel == 2 * sum(p.numel() for p in adapter.values())
    trained, total = lora.parameter_counts(model)
    assert trained == sum(p.numel() for p in adapter.values()) and trained < total / 20


def _greedy(engine: EmbeddedEngine) -> list[int]:
    return asyncio.run(engine.generate(PROMPT, max_tokens=12, temperature=0.0)).token_ids


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([PROMPT])).logits[0].float()


def test_a_push_sends_only_the_adapter_and_changes_what_the_engine_samples() -> None:
    path = shared_tiny_model()
    model = load_trained_model(path, model_settings(path))
    learner = learner_for(model)
    full_bytes = weight_push.tensor_bytes(dict(model.get_base_model().state_dict()))
    with EmbeddedEngine(path) as engine:
        before = _greedy(engine)
        with torch.no_grad():  # a trained adapter, large enough to change the greedy reply
            for name, p in adapter_params(model).items():
                p.normal_(0.0, 0.3 if "lora_B" in name else 0.5)
        learner.push(engine)
        assert engine.weight_version == 1
        adapter_bytes = weight_push.tensor_bytes(weight_push.adapter_state(model))
        assert learner.pushed_bytes == adapter_bytes < full_bytes / 20  # the base is never re-sent
        # The engine serves base + adapter: its logits are the learner's (PEFT's unmerged forward).
        assert torch.allclose(_logits(engine.model), _logits(model), atol=1e-4)
        assert _greedy(engine) != before
        # Each push merges onto the base kept aside, not onto the last merge: a zero adapter gives the base back.
        with torch.no_grad():
            for name, p in adapter_params(model).items():
                if "lora_B" in name:
                    p.zero_()
        learner.push(engine)
        assert _greedy(engine) == before
        assert torch.allclose(_logits(engine.model), _logits(model.get_base_model()), atol=1e-5)


def test_push_merged_sends_the_merged_weights() -> None:
    path = shared_tiny_model()
    settings = LoraConfig(**{**LORA.__dict__, "push": "merged"})
    model = load_trained_model(path, model_settings(path, settings))
    with torch.no_grad():
        for p in adapter_params(model).values():
            p.normal_(0.0, 0.2)
    learner = Learner(model, lr=1e-3, lora=settings)
    with EmbeddedEngine(path) as engine:
        learner.push(engine)
        # The tiny model ties its head to the embedding: each tensor of the engine's counted once.
        once = {v.data_ptr(): v for v in engine.model.state_dict().values()}
        assert learner.pushed_bytes == weight_push.tensor_bytes(once)
        assert torch.allclose(_logits(engine.model), _logits(model), atol=1e-4)


def test_a_full_push_sends_a_tied_head_once_and_the_engine_head_follows() -> None:
    path = shared_tiny_model()
    model = load_trained_model(path, ModelConfig(_target_="agentrl.models.hf.local_model", path=path))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1.5)  # what a step changes, the tied head with it
    learner = Learner(model, lr=1e-3)
    with EmbeddedEngine(path) as engine:
        learner.push(engine)
        embedding = model.get_input_embeddings().weight
        sent = weight_push.tensor_bytes(dict(model.state_dict())) - weight_push.tensor_bytes({"": embedding})
        assert learner.pushed_bytes == sent
        assert torch.equal(engine.model.get_output_embeddings().weight, embedding)
        assert torch.allclose(_logits(engine.model), _logits(model), atol=1e-4)


def test_an_adapter_a_full_model_engine_cannot_take_is_refused_naming_it() -> None:
    path = shared_tiny_model()
    model = load_trained_model(path, model_settings(path))
    with EmbeddedEngine(path) as engine:
        bad = {k.replace("q_proj", "nope_proj"): v for k, v in weight_push.adapter_state(model).items()}
        with pytest.raises(ValueError, match="nope_proj"):
            engine.update_adapter(bad, LORA)
        half = {k: v for k, v in weight_push.adapter_state(model).items() if "lora_B" not in k}
        with pytest.raises(ValueError, match="lora_A but not its other matrix"):
            engine.update_adapter(half, LORA)
        assert engine.weight_version == 0


def test_a_checkpoint_restores_adapter_and_optimizer_exactly(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = shared_tiny_model()
    model = load_trained_model(path, model_settings(path))
    learner = learner_for(model)
    learner.step(items())
    learner.step(items(1))
    saved = ckpt.save(tmp_path, 2, model=model, tokenizer=AutoTokenizer.from_pretrained(path),
                      state={"optimizer": learner.optimizer.state_dict()}, keep=1)
    # The checkpoint holds the adapter and a pointer to the base, not a copy of the base.
    config = json.loads((saved / "model" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == path and config["r"] == LORA.rank
    assert not (saved / "model" / "model.safetensors").exists()
    assert (saved / "model" / "adapter_model.safetensors").stat().st_size < 200_000

    again = load_trained_model(str(saved / "model"), model_settings(path))
    resumed = learner_for(again)
    resumed.optimizer.load_state_dict(ckpt.load_state(saved)["optimizer"])
    a, b = adapter_params(model), adapter_params(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(b[k].requires_grad for k in b) and lora.parameter_counts(again) == lora.parameter_counts(model)
    # The optimizer state sits on the same parameters: one more identical step moves both models identically.
    learner.step(items(2))
    resumed.step(items(2))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_target_module_the_model_lacks_fails_at_plan_time_naming_it(tmp_path: Path) -> None:
    from agentrl.plan import PlanError, build_plan

    path = shared_tiny_model()
    cfg = compose_config("model=hf", f"model.path={path}", "model.lora.enabled=true",
                         "model.lora.target_modules=[q_proj,qkv_proj]", f"paths.output_root={tmp_path}")
    with pytest.raises(PlanError, match="no module 'qkv_proj'.*linear layers are .*q_proj"):
        build_plan(cfg, choices={}, run_dir=tmp_path / "run")
    cfg = compose_config("model=hf", f"model.path={path}", "model.lora.enabled=true", "model.lora.rank=8",
                         f"paths.output_root={tmp_path}")
    plan = build_plan(cfg, choices={}, run_dir=tmp_path / "run")
    note = next(n for n in plan.notes if n.startswith("LoRA"))
    assert "rank 8" in note and "push=adapter" in note and "parameters trained" in note
    with pytest.raises(Exception, match="model.lora.rank must be an integer >= 1"):
        build_plan(compose_config("model.lora.rank=0", f"paths.output_root={tmp_path}"), choices={},
                   run_dir=tmp_path / "run")


def test_an_adapter_folder_is_served_and_merged_as_base_plus_adapter(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models.merge_lora import merge_lora

    path = shared_tiny_model()
    model = load_trained_model(path, model_settings(path))
    with torch.no_grad():
        for p in adapter_params(model).values():
            p.normal_(0.0, 0.2)
    model.save_pretrained(tmp_path / "final_model")
    AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path / "final_model")
    want = _logits(model)
    # The embedded engine started on the adapter folder (a resumed run's, `agentrl eval` of a final model).
    with EmbeddedEngine(tmp_path / "final_model") as engine:
        assert torch.allclose(_logits(engine.model), want, atol=1e-4)
    # The documented merge command: a full Hugging Face folder with the same outputs.
    merged = merge_lora(tmp_path / "final_model", tmp_path / "merged")
    assert (merged / "config.json").is_file() and not (merged / "adapter_config.json").exists()
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(merged)), want, atol=1e-4)
    with pytest.raises(ValueError, match="not a LoRA adapter folder"):
        merge_lora(path, tmp_path / "again")
    # model=hf model.path=<adapter folder> is checked with its base; a base that moved is named.
    from agentrl.models.hf import local_model

    assert local_model(str(tmp_path / "final_model")) == str(tmp_path / "final_model")
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "final_model", moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "/nowhere/base"}))
    with pytest.raises(ValueError, match="applies to base model /nowhere/base, which is not a local model folder"):
        local_model(str(moved))
