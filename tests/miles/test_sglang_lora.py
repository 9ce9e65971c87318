"""inference=sglang with model.lora (push=adapter): the launch command (flags checked against SGLang's own
server_args), the dry run's line showing it, and the adapter push's calls against stand-in SGLang servers (SGLang
needs a GPU; the routes and fields are SGLang's, sglang/srt/entrypoints/http_server.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from agentrl.config.model import LoraConfig
from agentrl.inference.engines.sglang import START_ADAPTER, SGLangEngine, launch_commands

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"])


def test_launch_commands_serve_adapters_with_real_sglang_flags() -> None:
    argv = launch_commands("/m/Qwen3-4B", lora=LORA, start_adapter="/ckpt/model")[0][0]
    tail = argv[argv.index("--enable-lora"):]
    assert tail == ["--enable-lora", "--max-lora-rank", "4", "--max-loras-per-batch", "1",
                    "--lora-target-modules", "q_proj", "v_proj", "--lora-paths", f"{START_ADAPTER}=/ckpt/model"]
    assert "--enable-lora" not in launch_commands("/m/Qwen3-4B")[0][0]  # full fine-tuning: no LoRA flag
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("no sglang installed (scripts/install_miles_light.sh brings Miles' vendored one)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "srt"
    source = (folder / "server_args.py").read_text()
    for flag in [a for a in argv if a.startswith("--")]:
        assert f'"{flag}"' in source, flag
    supported = (folder / "utils" / "common.py").read_text()
    block = supported[supported.index("SUPPORTED_LORA_TARGET_MODULES = ["):]
    for module in LORA.target_modules:  # --lora-target-modules takes only SGLang's listed choices
        assert f'"{module}"' in block[:block.index("]")], module


def test_the_dry_run_shows_the_sglang_command_with_lora(tmp_path: Path) -> None:
    from agentrl.testing.cli import run_cli

    proc = run_cli(["+recipe=gridsim_grpo", "inference=sglang", "model.lora.enabled=true", "model.lora.rank=8",
                    "dry_run=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if "sglang server 0 of 1" in x)
    assert re.search(r"sglang\.launch_server --model-path \S+ .*--enable-lora --max-lora-rank 8 "
                     r"--max-loras-per-batch 1 --lora-target-modules q_proj k_proj v_proj o_proj", line), line


def _adapter(rank: int) -> dict[str, torch.Tensor]:
    return {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(rank, 32),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(64, rank)}


def test_an_adapter_push_loads_only_the_adapter_then_routes_calls_to_it(tiny_model_path, stand_in_sglang):
    a, b = stand_in_sglang(generate_ids=[11], stop_id=2), stand_in_sglang(generate_ids=[11], stop_id=2)
    engine = SGLangEngine(tiny_model_path, urls=[a.url, b.url], lora=LORA)
    try:
        first = engine.update_adapter(_adapter(4), LORA)
        first_folder = Path(next(body for p, body in a.calls if p == "/load_lora_adapter")["lora_path"])
        assert first_folder.is_dir()
        second = engine.update_adapter(_adapter(4), LORA)
        assert (first, second) == (1, 2) and engine.weight_version == 2
        assert not first_folder.exists()  # unloaded by the servers, so deleted: one folder a step would pile up
        for server in (a, b):
            calls = [(p, body) for p, body in server.calls if p != "/generate"]
            assert [p for p, _ in calls] == ["/load_lora_adapter", "/update_weight_version", "/load_lora_adapter",
                                             "/unload_lora_adapter", "/update_weight_version"]
            load = calls[2][1]
            assert load["lora_name"] == "agentrl-lora-v2" and load["in_flight"] == 0  # admission was closed
            assert load["files"] == ["adapter_config.json", "adapter_model.safetensors"]  # no base weights
            assert calls[3][1]["lora_name"] == "agentrl-lora-v1"
        adapter_bytes = sum(t.numel() * t.element_size() for t in _adapter(4).values())
        assert adapter_bytes <= engine.last_push_bytes < adapter_bytes + 16_384
        done = asyncio.run(engine.generate([1, 5], max_tokens=4))
        assert done.weight_version == 2
        sent = [body for p, body in a.calls + b.calls if p == "/generate"]
        assert sent[-1]["lora_path"] == "agentrl-lora-v2"
        with pytest.raises(ValueError, match="model.lora.rank is 4"):
            engine.update_adapter(_adapter(8), LORA)
        assert engine.weight_version == 2
    finally:
        engine.close()
