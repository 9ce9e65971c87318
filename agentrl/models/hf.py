"""`model=hf`: any local Hugging Face folder (e.g. Qwen3-4B). Nothing is ever fetched from a hub."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrl.models.lora_folder import ADAPTER_WEIGHTS, adapter_base, is_adapter_folder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")


def _offline() -> None:
    """Put this process in Hugging Face offline mode (belt and braces next to local_files_only)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # huggingface_hub reads the variable once, at import; it may already have been imported.
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True


def local_model(path: str, chat_template: str | None = None, template_dir: str | None = None, **_: Any) -> str:
    """Check that `path` is a usable local model folder and return it as an absolute path (with `chat_template`,
    a file: the folder that serves it with that template, `models.chat_templates`).

    Usable: a folder with `config.json`, weights, and a tokenizer that loads offline and has a chat template; or a
    LoRA adapter folder (`adapter_config.json`, its weights and tokenizer) whose base model folder is usable.
    Raises FileNotFoundError or ValueError saying what is missing.
    """
    _offline()
    if not path or str(path) == "???":
        raise ValueError("model=hf needs model.path: a local Hugging Face folder, e.g. model.path=/data/Qwen3-4B")
    folder = Path(path).expanduser().absolute()
    if not folder.is_dir():
        raise FileNotFoundError(f"model.path={path!r} is not a folder; model=hf takes a local Hugging Face "
                                "folder (nothing is downloaded)")
    adapter = is_adapter_folder(folder)  # a LoRA adapter (a LoRA run's final_model): checked with its base
    if adapter:
        try:
            adapter_base(folder)
        except ValueError as exc:
            raise ValueError(f"model.path={folder}: {exc}") from exc
    elif not (folder / "config.json").is_file():
        raise ValueError(f"model.path={folder} has no config.json: not a Hugging Face model folder")
    if adapter and not (folder / ADAPTER_WEIGHTS).is_file():
        raise ValueError(f"model.path={folder} is a LoRA adapter folder without {ADAPTER_WEIGHTS}")
    if not adapter and not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise ValueError(f"model.path={folder} holds no weights (*.safetensors or pytorch_model*.bin)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"model.path={folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    if chat_template:
        from agentrl.models.chat_templates import with_chat_template

        folder = Path(with_chat_template(folder, chat_template, template_dir))
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any loader failure means the same thing to the user
        raise ValueError(f"model.path={folder}: the tokenizer does not load offline ({type(e).__name__}: {e})") from e
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"model.path={folder}: the tokenizer has no chat template (chat_template.jinja or "
                         "tokenizer_config.json 'chat_template'); agents need one to render tools and turns: "
                         "give one with model.chat_template=FILE (docs/models.md)")
    return str(folder)


def load_model_and_tokenizer(path: str, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Load (model, tokenizer) from a local folder, offline, in eval mode.

    `dtype` (a torch.dtype or its name, e.g. "bfloat16") defaults to float32 on CPU and bfloat16 on CUDA.
    """
    _offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    elif isinstance(dtype, str):
        resolved = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32' or 'bfloat16'")
        dtype = resolved
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return model.to(device).eval(), tokenizer
