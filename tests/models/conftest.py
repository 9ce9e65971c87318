"""A tiny model built once per test session (a few seconds) and shared by the model tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.models.tiny import ensure_tiny_model


@pytest.fixture(autouse=True)
def one_torch_thread():
    # The machine's 2 cores are shared; two torch threads under load are ~20x slower than one.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(ensure_tiny_model(str(tmp_path_factory.mktemp("models") / "tiny-s0"), seed=0))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
