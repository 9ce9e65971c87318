"""Schemas of the `inference` group: the engine that samples."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class InferenceConfig:
    _target_: str = MISSING
    host: str = "127.0.0.1"
    port: int = 0  # the session server's port; 0 picks a free one
    max_body_bytes: int = 16 << 20  # the session server refuses a larger request body (413)


@dataclass
class EmbeddedInferenceConfig(InferenceConfig):
    _target_: str = "agentrl.inference.engine.EmbeddedEngine"
    model_path: str = "${model.path}"  # the weights served (trainers pass their current checkpoint)
    device: str = "cpu"  # cpu (float32) | cuda (bfloat16)
    max_batch_sequences: int = 64  # sequences decoded together in one forward pass
    batch_wait_ms: float = 2.0  # how long a new request waits for others to share its batch


@dataclass
class SGLangInferenceConfig(InferenceConfig):
    _target_: str = "agentrl.inference.sglang.SGLangEngine"
    model_path: str = "${model.path}"  # the weights served (trainers pass their current checkpoint)
    urls: list[str] = field(default_factory=list)  # empty: launch one server per GPU
    num_gpus: int = 1
    base_port: int = 30000
    mem_fraction_static: float = 0.7
    tool_call_parser: str = "qwen25"
    reasoning_parser: str | None = None  # e.g. qwen3; null: none
    launch_timeout: float = 600.0  # seconds
    request_timeout: float = 600.0  # seconds for one generate call
    extra_args: list[str] = field(default_factory=list)  # appended to every launch command
