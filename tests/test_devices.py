"""Device choice for the engine and the trainer: resolved from the config, refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from agentrl.devices import DeviceError, autocast, check_devices, resolve_device, set_threads, train_device
from agentrl.testing.cli import run_cli

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without a GPU gives")


def cfg(trainer: dict, inference: dict) -> object:
    return OmegaConf.create({"trainer": trainer, "inference": inference})


def test_auto_follows_the_embedded_engine_and_an_explicit_device_wins():
    assert train_device(cfg({"device": "auto"}, {"device": "cpu"})) == torch.device("cpu")
    assert train_device(cfg({"device": "cpu"}, {"device": "cpu"})) == torch.device("cpu")
    assert train_device(cfg({}, {"device": "cpu"})) == torch.device("cpu")  # a trainer without the key
    # SGLang serving names no engine device: the trainer takes a GPU when there is one.
    expected = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert train_device(cfg({"device": "auto"}, {"urls": []})) == expected


@no_gpu
def test_cuda_without_a_gpu_names_the_key_that_asked_for_it():
    with pytest.raises(DeviceError, match=r"trainer.device='cuda' but torch .* sees no CUDA GPU"):
        train_device(cfg({"device": "cuda"}, {"device": "cpu"}))
    with pytest.raises(DeviceError, match=r"inference.device='cuda:0'"):
        check_devices(cfg({"device": "auto"}, {"device": "cuda:0"}))
    # auto inherits the engine's device, so the engine's key is the one named.
    with pytest.raises(DeviceError, match=r"inference.device='cuda'"):
        train_device(cfg({"device": "auto"}, {"device": "cuda"}))


def test_a_name_that_is_no_device_is_refused():
    with pytest.raises(DeviceError, match="is not a device"):
        resolve_device("gpu0", "trainer.device")
    with pytest.raises(DeviceError, match="runs on cpu or cuda"):
        resolve_device("meta", "trainer.device")
    check_devices(cfg({"device": "cpu"}, {"device": "cpu"}))  # a good config passes


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")  # made here, never entered
def test_autocast_is_bf16_on_cuda_only():
    with autocast(torch.device("cpu")):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    ctx = autocast(torch.device("cuda"))
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16


@no_gpu
def test_cli_refuses_a_missing_gpu_before_any_run_starts(agentrl_home: Path, tmp_path: Path):
    proc = run_cli(["+recipe=gridsim_grpo", "trainer.device=cuda"], cwd=tmp_path, timeout=900)
    assert proc.returncode != 0
    assert "trainer.device='cuda' but torch" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (agentrl_home / "outputs" / "mlflow.db").exists()  # no MLflow run was opened


def test_threads_apply_only_when_set_and_a_negative_count_is_refused():
    before = torch.get_num_threads()
    try:
        assert set_threads(OmegaConf.create({"trainer": {"threads": 0}})) == before  # 0: torch's default stays
        assert set_threads(OmegaConf.create({"trainer": {"threads": 1}})) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(DeviceError, match=r"trainer.threads=-2"):
        check_devices(cfg({"device": "cpu", "threads": -2}, {"device": "cpu"}))


def test_the_plan_line_names_each_thread_choice(monkeypatch):
    from agentrl.devices import describe_threads

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    cfg = OmegaConf.create({"trainer": {"threads": 1, "warm_start": {"enabled": True, "checkpoint": None}}})
    line = describe_threads(cfg)
    assert line.startswith(f"warm start {torch.get_num_threads()} (torch's default")
    assert "trainer 1 (trainer.threads)" in line and line.endswith("OMP_WAIT_POLICY=passive")
    # A reused warm start runs no SFT here: only the trainer's threads are named.
    cfg.trainer.warm_start.checkpoint, cfg.trainer.threads = "/some/folder", 0
    assert describe_threads(cfg).startswith(f"trainer {torch.get_num_threads()} (torch's default)")


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_importing_agentrl_makes_openmp_threads_sleep_unless_told_otherwise(given, seen):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", "import agentrl, os; print(os.environ['OMP_WAIT_POLICY'])"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == seen
