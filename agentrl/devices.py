"""Which torch device the engine and the trainer use (and how many CPU threads), checked before anything starts."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch


class DeviceError(ValueError):
    """A config asks for a device this machine does not have (or names no device at all)."""


def resolve_device(name: str, where: str) -> torch.device:
    """`name` as a torch device; CUDA only when torch sees a GPU (a clear error naming `where` otherwise)."""
    try:
        device = torch.device(str(name))
    except (RuntimeError, ValueError) as exc:
        raise DeviceError(f"{where}={name!r} is not a device: use cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"{where}={name!r} but torch {torch.__version__} sees no CUDA GPU here: "
                              f"set {where}=cpu, or install a CUDA build of torch on a GPU machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"{where}={name!r} but this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif device.type != "cpu":
        raise DeviceError(f"{where}={name!r}: agentrl runs on cpu or cuda")
    return device


def _option(settings: Any, group: str, key: str, default: Any = None) -> Any:
    """`settings.<group>.<key>`, or `default` where the group's schema has no such key (e.g. trainer=miles has no
    `trainer.device`, SGLang no `inference.device`). `settings` is the plan's typed config; a DictConfig reads
    the same."""
    node = getattr(settings, group, None)
    value = getattr(node, key, default) if node is not None else default
    return default if value is None else value


def train_device(settings: Any) -> torch.device:
    """The device the built-in trainers train on.

    `trainer.device` when set; with "auto" (the default), the embedded engine's device, so generation and
    training share the GPU; with SGLang serving (no engine device), the first GPU when there is one.
    """
    want = str(_option(settings, "trainer", "device", "auto") or "auto")
    if want != "auto":
        return resolve_device(want, "trainer.device")
    return _engine_device(settings) or torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _engine_device(settings: Any) -> torch.device | None:
    """The embedded engine's device (None for an engine without one, e.g. SGLang)."""
    name = _option(settings, "inference", "device")
    return resolve_device(str(name), "inference.device") if name else None


def check_devices(settings: Any) -> None:
    """Raise `DeviceError` now for a device the run would fail on later (the engine's, the trainer's), or a
    `model.dtype` the training device cannot run."""
    _engine_device(settings)
    if _option(settings, "trainer", "device") is not None:
        device = train_device(settings)
        if str(_option(settings, "model", "dtype", "float32")) == "bfloat16" and device.type == "cuda" \
                and not torch.cuda.is_bf16_supported():
            raise DeviceError(f"model.dtype=bfloat16 but the GPU {torch.cuda.get_device_name(device)} has no bf16 "
                              "support: use model.dtype=float32")
    _threads(settings)


def _threads(settings: Any) -> int:
    threads = _option(settings, "trainer", "threads", 0)
    if threads < 0:
        raise DeviceError(f"trainer.threads={threads}: use a positive count, or 0 for torch's default")
    return threads


def set_threads(settings: Any) -> int:
    """Apply `trainer.threads` (torch's CPU threads for this process; 0 or absent: leave torch's default).

    Returns the thread count in effect. A tiny model gains nothing from several threads per matmul, and on a
    small box they compete with the env server and the session server, which share this process.
    """
    threads = _threads(settings) or _split_threads(settings)
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def _split_threads(settings: Any) -> int:
    """With the engine in its own process and `trainer.threads` 0: the cores the engine process leaves (else 0)."""
    if not _option(settings, "inference", "process", False):
        return 0
    return max(1, (os.cpu_count() or 2) - engine_threads(_option(settings, "inference", "process_threads", 0)))


def engine_threads(configured: int) -> int:
    """The engine process's torch threads (`inference.process=true`): `inference.process_threads`, or half the
    cores (at least one), leaving the rest to the learner."""
    return int(configured) if configured and configured > 0 else max(1, (os.cpu_count() or 2) // 2)


def describe_threads(settings: Any) -> str:
    """The plan's `threads` line: torch's CPU threads for the warm start and for the trainer's loop, and how
    OpenMP's idle threads wait (spinning threads fight any other job on a small box)."""
    default = torch.get_num_threads()  # torch's default here: one per core, unless OMP_NUM_THREADS says otherwise
    loop = _threads(settings) or _split_threads(settings) or default
    source = "trainer.threads" if _threads(settings) else \
        "the cores the engine process leaves" if _split_threads(settings) else "torch's default"
    parts = []
    ws = _option(settings, "trainer", "warm_start")
    if ws is not None and ws.enabled and not ws.checkpoint:
        parts.append(f"warm start {default} (torch's default, {os.cpu_count()} cores)")
    parts.append(f"trainer {loop} ({source})")
    if _option(settings, "inference", "process", False):  # the engine's own process: its threads, on other cores
        parts.append(f"engine process {engine_threads(_option(settings, 'inference', 'process_threads', 0))} "
                     "(inference.process_threads; 0: half the cores)")
    policy = os.environ.get("OMP_WAIT_POLICY", "")
    parts.append(f"OMP_WAIT_POLICY={policy.lower() or 'unset (spin, then sleep)'}")
    return ", ".join(parts)


def autocast(device: torch.device, mode: str = "auto") -> contextlib.AbstractContextManager:
    """The training forward's autocast for `model.autocast` (`mode`): bf16 matmuls over the weights' own dtype.
    auto: bf16 on CUDA, nothing on a CPU; bfloat16: bf16 on either (a CPU with AMX-BF16 runs it ~2x faster);
    float32: nothing."""
    if mode == "float32" or (mode == "auto" and device.type != "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda" if device.type == "cuda" else "cpu", dtype=torch.bfloat16)


AUTOCAST_ATTRIBUTE = "agentrl_autocast"  # set on a model to train by `trained_model.prepare_for_training`


def model_autocast(model: Any) -> str:
    """The autocast mode a model to train was prepared with (`model.autocast`; auto when none was set)."""
    return str(getattr(model, AUTOCAST_ATTRIBUTE, None) or "auto")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device `model`'s parameters are on."""
    return next(model.parameters()).device


def release_freed_memory(collect: bool = True) -> None:
    """Hand memory that Python and torch have freed back to the OS (glibc's `malloc_trim`; a no-op elsewhere).

    glibc keeps freed blocks under its mmap threshold in its arenas, and that threshold rises to 32 MB once a
    large block is freed, so after a training step's activations (GBs for a real model) or a warm start's model
    and optimizer the process keeps them resident: a calc_smollm2 run held 7 GB between steps with 2.6 GB of
    live tensors, and grew to 10 GB. `collect`: run Python's cycle collector first (~0.1 s with torch and
    transformers loaded: between stages, not after every update, where a tiny model's step is ~1 s)."""
    import ctypes
    import gc

    if collect:
        gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
