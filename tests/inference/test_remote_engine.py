"""The admission gate shared by the vLLM and SGLang engines: a push waits for the running calls, holds new ones
until it is done, and re-opens whatever happens; a failure reaches every waiting call. And the folders a push
writes (`weight_folders.py`)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
import torch

from agentrl.inference.engines.completion import EngineUnavailable
from agentrl.inference.engines.remote_adapters import adapter_folder
from agentrl.inference.engines.server_backed import Admission
from agentrl.inference.engines.weight_folders import folder_bytes, made_here, new_folder, weights_folder


def test_calls_go_to_the_least_busy_server_that_is_up() -> None:
    gate = Admission(["a", "b"], "E")
    assert [gate.admit(block=False) for _ in range(3)] == ["a", "b", "a"]
    gate.down.add("a")
    assert gate.admit(block=False) == "b"
    assert gate.in_flight == {"a": 2, "b": 2}


def test_a_push_waits_for_running_calls_and_holds_new_ones() -> None:
    gate = Admission(["a"], "E")
    running = gate.admit(block=False)
    order: list[str] = []
    pushed = threading.Event()

    def push() -> None:
        with gate.paused(timeout=None):
            order.append("push")
        pushed.set()

    pusher = threading.Thread(target=push)
    pusher.start()
    while gate.admitting:  # the push has closed admission and waits for the running call
        threading.Event().wait(0.01)
    assert gate.admit(block=False) is None  # a new call is held, not sent to the old weights
    late = threading.Thread(target=lambda: order.append(f"late:{gate.admit(block=True)}"))
    late.start()
    order.append("release")
    gate.release(running)
    pusher.join(60)
    late.join(60)
    assert order == ["release", "push", "late:a"]
    assert pushed.is_set() and gate.admitting


def test_a_push_that_times_out_reopens_admission() -> None:
    gate = Admission(["a"], "E")
    gate.admit(block=False)
    with pytest.raises(TimeoutError), gate.paused(timeout=0.05):
        pass
    assert gate.admitting and gate.admit(block=False) == "a"


def test_an_error_inside_the_push_reopens_admission() -> None:
    gate = Admission(["a"], "E")
    with pytest.raises(RuntimeError, match="refused"), gate.paused(timeout=None):
        raise RuntimeError("server refused the weights")
    assert gate.admit(block=False) == "a"


def test_a_failure_reaches_waiting_and_later_calls() -> None:
    gate = Admission(["a"], "E")
    gate.down.add("a")  # every server restarting: calls wait
    seen: list[BaseException] = []

    async def call() -> None:
        try:
            await gate.acquire()
        except EngineUnavailable as exc:
            seen.append(exc)

    waiter = threading.Thread(target=asyncio.run, args=(call(),))
    waiter.start()
    gate.fail(EngineUnavailable("server a exited with -9"))
    waiter.join(60)
    assert [str(e) for e in seen] == ["server a exited with -9"]
    with pytest.raises(EngineUnavailable, match="exited"):
        gate.admit(block=False)
    with pytest.raises(EngineUnavailable, match="exited"), gate.paused(timeout=None):
        pass
    gate2 = Admission(["a"], "VLLMEngine")
    gate2.close()
    with pytest.raises(EngineUnavailable, match="VLLMEngine is closed"):
        gate2.admit(block=True)


def test_weights_folder_saves_a_state_dict_and_passes_a_folder_through(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tied = torch.zeros(2, 3)
    folder = weights_folder({"embed": tied, "lm_head": tied}, model, "vLLM", tmp_path / "w")
    assert made_here(folder) and folder.parent == tmp_path / "w"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert weights_folder(model, model, "vLLM") == model and not made_here(model)
    with pytest.raises(FileNotFoundError, match="SGLang loads whole folders"):
        weights_folder(tmp_path / "missing", model, "SGLang")


def test_an_adapter_folder_is_a_peft_folder_that_made_here_knows(tmp_path) -> None:
    lora = SimpleNamespace(rank=2, alpha=4.0, dropout=0.0, target_modules=["q_proj"])
    adapter = {"m.q_proj.lora_A.weight": torch.zeros(2, 3), "m.q_proj.lora_B.weight": torch.zeros(3, 2)}
    folder = adapter_folder(adapter, lora, tmp_path / "base", tmp_path / "w")
    assert made_here(folder) and folder.parent == tmp_path / "w"
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert folder_bytes(folder) == sum(p.stat().st_size for p in folder.iterdir())
    assert not made_here(None) and not made_here(tmp_path / "agentrl-lora-v0")
    with pytest.raises(ValueError, match="made_here would not know it"):
        new_folder("elsewhere-", tmp_path)
