"""`model.lora` under `trainer=miles`: Miles' own LoRA flags in the command (checked against Miles' argument parser
where it is installed), the dry run showing them, and the refusals naming what to set."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agentrl.config.model import LoraConfig
from agentrl.testing.cli import run_cli
from agentrl.trainers.miles.args import MilesConfigError, build_launch, check_config
from tests.miles.conftest import ctx, flags, make_settings
from tests.miles.test_miles_args import QWEN3_4B


def lora_settings(**lora):
    settings = make_settings()
    settings.model.lora = LoraConfig(**{"enabled": True, **lora})
    return settings


def test_lora_maps_to_miles_flags(tmp_path: Path) -> None:
    settings = lora_settings(rank=32, alpha=64.0, dropout=0.05, target_modules=["q_proj", "v_proj"])
    f = flags(build_launch(settings, ctx(tmp_path), model_args=[]).argv)
    assert f["--lora-rank"] == ["32"] and f["--lora-alpha"] == ["64"] and f["--lora-dropout"] == ["0.05"]
    assert f["--target-modules"] == ["q_proj,v_proj"]
    off = flags(build_launch(make_settings(), ctx(tmp_path), model_args=[]).argv)
    assert "--lora-rank" not in off  # full fine-tuning: no LoRA flag at all


@pytest.mark.skipif(importlib.util.find_spec("miles") is None, reason="Miles is not installed")
def test_the_flags_are_miles_own_with_its_value_types() -> None:
    """Read from Miles' argument definitions (its source: importing it needs SGLang's GPU stack): each flag
    exists and takes the type the mapping writes; alpha is an integer there, which the plan checks."""
    import ast

    folder = Path(list(importlib.util.find_spec("miles").submodule_search_locations)[0])
    types = {}
    for node in ast.walk(ast.parse((folder / "utils" / "arguments.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            flag = getattr(node.args[0], "value", None)
            kind = next((k.value.id for k in node.keywords if k.arg == "type" and isinstance(k.value, ast.Name)),
                        None)
            types[flag] = kind
    expected = {"--lora-rank": "int", "--lora-alpha": "int", "--lora-dropout": "float", "--target-modules": "str"}
    assert {flag: types.get(flag, "missing") for flag in expected} == expected


@pytest.mark.parametrize(("lora", "trainer", "named"), [
    ({"alpha": 12.5}, {}, "set model.lora.alpha=12"),
    ({"push": "merged"}, {}, "set model.lora.push=adapter"),
    ({}, {"train_backend": "fsdp", "extra_args": ["--ci-test"]}, "set trainer.train_backend=megatron"),
])
def test_what_miles_cannot_take_is_refused_naming_the_key(lora: dict, trainer: dict, named: str) -> None:
    settings = lora_settings(**lora)
    for key, value in trainer.items():
        setattr(settings.trainer, key, value)
    with pytest.raises(MilesConfigError, match=named):
        check_config(settings)


@pytest.mark.slow
def test_the_dry_run_shows_the_lora_flags(agentrl_home: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("miles_tito_tokenizers") is None:
        pytest.skip("miles-tito-tokenizers is not installed: run scripts/install_miles_light.sh")
    model = tmp_path / "Qwen3-4B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_4B))
    proc = run_cli(["+recipe=gridsim_miles", "dry_run=true", f"model.path={model}", "model.lora.enabled=true",
                    "model.lora.rank=8", "model.lora.alpha=16"], cwd=tmp_path, env={"PYTHONPATH": "", "RAY_ADDRESS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("    --lora-rank 8\n    --lora-alpha 16\n    --lora-dropout 0\n    --target-modules "
            "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj\n") in proc.stdout
    refused = run_cli(["+recipe=gridsim_miles", "dry_run=true", f"model.path={model}", "model.lora.enabled=true",
                       "model.lora.push=merged"], cwd=tmp_path, env={"PYTHONPATH": "", "RAY_ADDRESS": ""})
    assert refused.returncode != 0 and "set model.lora.push=adapter" in refused.stderr
    assert "Traceback" not in refused.stderr
