"""recipes/gridsim_lora_4b.yaml (the one-GPU LoRA recipe for a Qwen3-4B-class model) dry-runs here: model.path is
required and named when missing; given a folder of Qwen3-4B's architecture, the plan reads its config and
tokenizer (never the weights: a placeholder stands for the 8 GB file) and says what LoRA trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.testing.cli import run_cli
from tests.miles.test_miles_args import QWEN3_4B


@pytest.fixture()
def qwen3_4b_shape(tmp_path: Path) -> Path:
    import shutil

    import torch
    from safetensors.torch import save_file

    from agentrl.testing.tiny_models import shared_tiny_model

    folder = tmp_path / "Qwen3-4B"
    folder.mkdir()
    for f in Path(shared_tiny_model()).glob("tokenizer*"):  # the tiny model's tokenizer and chat template
        shutil.copy(f, folder / f.name)
    (folder / "config.json").write_text(json.dumps({**QWEN3_4B, "architectures": ["Qwen3ForCausalLM"],
                                                    "max_position_embeddings": 40960}))
    save_file({"placeholder": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.slow
def test_the_4b_lora_recipe_dry_runs_and_says_what_trains(qwen3_4b_shape: Path, tmp_path: Path) -> None:
    done = run_cli(["+recipe=gridsim_lora_4b", f"model.path={qwen3_4b_shape}", "dry_run=true"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # Rank 16 on the 7 projections of 36 layers: 33,030,144 adapter parameters, 0.81% of the model.
    assert "LoRA rank 16, alpha 32, dropout 0 on q_proj" in done.stdout
    assert "33,030,144 of 4,055,498,240 parameters trained (0.81%); push=adapter" in done.stdout
    assert "inference  vllm" in done.stdout
    missing = run_cli(["+recipe=gridsim_lora_4b", "dry_run=true"], cwd=tmp_path)
    assert missing.returncode != 0 and "model.path" in missing.stderr and "Traceback" not in missing.stderr
