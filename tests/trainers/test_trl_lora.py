"""`trainer=trl` with `model.lora.enabled=true`: TRL's GRPOTrainer gets the run's LoRA as its `peft_config`.

Through the CLI, two steps from a full SFT warm start: the metrics are finite, and reading the final weights
(every rank's digest of the trained model, and `final_model/`) shows that only the adapter moved: each base weight
is the start's to the last bit while the adapter differs from where it started. The dry run prints the
`peft.LoraConfig` TRL gets, and the mapping builds a real one.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.config.model import TinyModelConfig
from agentrl.trainers.trl.args import peft_config, peft_kwargs
from tests.trainers.test_trl import SMALL, _cli, _run

LORA = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8", "trainer.lr=0.001"]


def _start_weights(start: Path) -> tuple[dict, dict]:
    """(base weights, adapter weights) the run started from: a full start folder has no adapter yet (PEFT's B = 0)."""
    from safetensors.torch import load_file

    from agentrl.models.lora_folder import adapter_base

    base = adapter_base(start)
    if base is None:
        return load_file(str(start / "model.safetensors")), {}
    return load_file(str(Path(base) / "model.safetensors")), load_file(str(start / "adapter_model.safetensors"))


@pytest.mark.slow
def test_two_lora_steps_log_finite_metrics_and_move_only_the_adapter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # The usual path: a full SFT warm start (on this tiny model a rank-4 one earns no reward yet), then LoRA RL.
    full = _cli([*SMALL, "trainer.steps=1", "trainer.eval_limit=1"], home)
    assert full.returncode == 0, full.stderr[-4000:]
    warm = _run(home, full.stdout)[1].data.tags["agentrl.warm_start"]
    done = _cli([*SMALL, *LORA, "trainer.steps=2", f"trainer.warm_start.checkpoint={warm}"], home)
    assert done.returncode == 0, done.stderr[-4000:]
    client, run = _run(home, done.stdout)
    for key in ("train/reward", "eval/reward", "train/loss", "train/grad_norm", "trl/loss"):
        assert math.isfinite(run.data.metrics[key]), key
    run_dir = Path(re.findall(r"run folder\s+(\S+)", done.stdout)[-1])
    digest = json.loads((run_dir / "trl_rank0_weights.json").read_text())
    base, start_adapter = _start_weights(Path(run.data.tags["agentrl.warm_start"]))
    lora_keys = [k for k in digest if ".lora_" in k]
    assert lora_keys, f"TRL trained no adapter: {sorted(digest)[:5]}"
    checked = 0
    for key, (total, squares) in digest.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        if name in base:  # a tied head is saved once
            assert total == pytest.approx(float(base[name].double().sum()), rel=1e-9, abs=1e-9), name
            assert squares == pytest.approx(float(base[name].double().pow(2).sum()), rel=1e-9), name
            checked += 1
    assert checked >= len(base) - 1, f"only {checked} of {len(base)} base weights were found in the trained model"
    grads = [m.value for m in client.get_metric_history(run.info.run_id, "train/grad_norm")]
    assert any(g > 0 for g in grads), f"no step had a gradient: {grads}"
    final = run_dir / "final_model"
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    from safetensors.torch import load_file

    trained = load_file(str(final / "adapter_model.safetensors"))
    if start_adapter:
        moved = [k for k, v in trained.items() if k in start_adapter and not v.equal(start_adapter[k])]
    else:  # PEFT starts B at zero
        moved = [k for k, v in trained.items() if ".lora_B." in k and float(v.abs().sum()) > 0]
    assert moved, "two steps with a gradient left the adapter where it started"


def test_the_dry_run_prints_the_peft_config(tmp_path: Path) -> None:
    done = _cli([*SMALL, *LORA, "trainer.steps=2", "dry_run=true"], tmp_path / "home", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "peft_config: peft.LoraConfig(task_type='CAUSAL_LM', r=4, lora_alpha=8.0" in done.stdout


def test_the_mapping_builds_a_real_peft_config() -> None:
    from peft import LoraConfig

    settings = SimpleNamespace(model=TinyModelConfig())  # what the mapping reads of the typed settings
    assert peft_kwargs(settings) is None and peft_config(settings) is None  # off by default: full fine-tuning
    settings.model.lora.enabled, settings.model.lora.rank = True, 8
    config = peft_config(settings)
    assert isinstance(config, LoraConfig) and config.r == 8 and config.lora_alpha == settings.model.lora.alpha
    assert set(config.target_modules) == set(settings.model.lora.target_modules)


def test_an_adapter_start_is_trained_further_under_lora_and_merged_without(tmp_path: Path) -> None:
    """TRL's start model from a LoRA warm start's adapter folder: the PeftModel under model.lora; without it the
    adapter merged into a plain model (full fine-tuning from a LoRA warm start), as the built-in trainers do."""
    import torch
    from peft import LoraConfig as PeftLora
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.trainers.trl.worker import trained_model

    base = ensure_tiny_model(str(tmp_path / "tiny"), vocab_size=512, hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1, intermediate_size=64, max_position_embeddings=64)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                          PeftLora(r=4, lora_alpha=8, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.fill_(0.05)  # B = 0 would merge to the base and hide a skipped merge
    peft.save_pretrained(tmp_path / "ckpt")
    merged = peft.merge_and_unload().state_dict()

    def settings(enabled: bool) -> SimpleNamespace:
        return SimpleNamespace(model=SimpleNamespace(dtype="float32", lora=SimpleNamespace(enabled=enabled)))

    model, config = trained_model(settings(True), str(tmp_path / "ckpt"))
    assert isinstance(model, PeftModel) and config is None
    assert any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    model, config = trained_model(settings(False), str(tmp_path / "ckpt"))
    assert not isinstance(model, PeftModel) and config is None
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.allclose(model.state_dict()[q], merged[q])
