"""Schemas of the `inference` group: the engine that samples."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from agentrl.config.numbers import check_counts, check_finite, check_ports

ENGINE_DTYPES = ("auto", "float32", "bfloat16")  # the embedded engine's (inference.dtype)
VLLM_DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass
class InferenceConfig:
    _target_: str = MISSING
    host: str = "127.0.0.1"
    port: int = 0  # the session server's port; 0 picks a free one
    max_body_bytes: int = 16 << 20  # the session server refuses a larger request body (413)


def check_server_numbers(c: InferenceConfig) -> None:
    """The session server's port and body limit, and an engine's timeouts where it has them."""
    check_ports("inference", c, ("port",))
    check_counts("inference", c, ("max_body_bytes",))
    check_finite("inference", c, [n for n in ("launch_timeout", "request_timeout") if hasattr(c, n)], positive=True)


@dataclass
class EmbeddedInferenceConfig(InferenceConfig):
    _target_: str = "agentrl.inference.engines.embedded.process.embedded_engine"
    model_path: str = "${model.path}"  # the weights served (trainers pass their current checkpoint)
    device: str = "cpu"  # cpu (float32) | cuda (bfloat16)
    # The served weights' dtype: auto (float32 on a CPU, bfloat16 on CUDA) | float32 | bfloat16 (a CPU with
    # AMX-BF16 decodes faster; the learner-vs-engine logprob gap is measured in benchmarks/RESULTS.md).
    dtype: str = "auto"
    max_batch_sequences: int = 64  # sequences decoded together in one forward pass
    batch_wait_ms: float = 2.0  # how long a new request waits for others to share its batch
    # Run the engine in a child process of its own, so generation and training use different cores (a 2-core box:
    # one each); weights reach it as a saved folder. process_threads: its torch threads (0: half the cores).
    process: bool = False
    process_threads: int = 0

    def __post_init__(self) -> None:
        check_server_numbers(self)
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(f"inference.dtype={self.dtype!r}: choose one of {', '.join(ENGINE_DTYPES)}")
        check_counts("inference", self, ("max_batch_sequences",))
        check_finite("inference", self, ("batch_wait_ms",))
        if int(self.process_threads) < 0:
            raise ValueError(f"inference.process_threads must be >= 0 (0: half the cores), got {self.process_threads}")


@dataclass
class SGLangInferenceConfig(InferenceConfig):
    _target_: str = "agentrl.inference.engines.sglang.SGLangEngine"
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

    def __post_init__(self) -> None:
        check_server_numbers(self)
        check_counts("inference", self, ("num_gpus",))
        check_ports("inference", self, ("base_port",))
        if not (isinstance(self.mem_fraction_static, int | float) and 0 < self.mem_fraction_static <= 1):
            raise ValueError(f"inference.mem_fraction_static must be in (0, 1], got {self.mem_fraction_static!r}")


@dataclass
class VLLMInferenceConfig(InferenceConfig):
    """vLLM OpenAI servers (the CPU build here, CUDA on GPUs): launched from their own venv, or running ones."""

    _target_: str = "agentrl.inference.engines.vllm.engine.VLLMEngine"
    model_path: str = "${model.path}"  # the weights served (trainers pass their current checkpoint)
    urls: list[str] = field(default_factory=list)  # running servers (any host); empty: launch num_servers
    num_servers: int = 1
    base_port: int = 0  # the first launched server's port (the next ones follow); 0: free ports
    python: str | None = None  # the vLLM venv's python; null: $AGENTRL_VLLM_PYTHON, else scripts/install_vllm.sh's
    dtype: str = "float32"
    enforce_eager: bool = True  # no graph capture: starts faster, and the only mode vLLM's CPU build tests
    max_model_len: int | None = None  # null: the model's own context
    kv_cache_gib: int = 1  # the CPU build's KV cache per launched server, GiB (VLLM_CPU_KVCACHE_SPACE)
    server_env: dict[str, str] = field(default_factory=dict)  # more environment for launched servers
    weights_dir: str | None = None  # where pushed weights are written; servers on other hosts need it shared
    launch_timeout: float = 600.0  # seconds for a launched server to answer /health
    request_timeout: float = 600.0  # seconds for one generate call
    health_every_s: float = 1.0  # how often each server's /health is asked (a dead one is named within seconds)
    restart: bool = False  # a launched server that dies is started again (with the current weights)
    extra_args: list[str] = field(default_factory=list)  # appended to every launch command
    # Per-request seeds. Off: vLLM 0.32's CPU build kills its engine when a seeded request's prompt is prefilled
    # in chunks (a CPU torch.Generator has no offset to rewind), which 32+ concurrent sessions cause. The CUDA
    # build has no such limit: turn it on there for reproducible sampling.
    seeded: bool = False

    def __post_init__(self) -> None:
        check_server_numbers(self)
        check_counts("inference", self, ("num_servers",))
        check_counts("inference", self, ("kv_cache_gib",), meaning=" (GiB)")
        check_ports("inference", self, ("base_port",))
        check_finite("inference", self, ("health_every_s",), positive=True)
        if self.max_model_len is not None:
            check_counts("inference", self, ("max_model_len",), meaning=" (or null: the model's own context)")
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"inference.dtype must be one of {VLLM_DTYPES}, got {self.dtype!r}")
        if self.restart and self.urls:
            raise ValueError("inference.restart=true restarts servers agentrl launched; with inference.urls the "
                             "servers are someone else's: restart them there")

