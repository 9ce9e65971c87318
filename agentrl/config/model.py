"""Schemas of the `model` group: weights and tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING


@dataclass
class ModelConfig:
    _target_: str = MISSING
    path: str = MISSING


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


@dataclass
class HFModelConfig(ModelConfig):
    _target_: str = "agentrl.models.hf.local_model"
    path: str = MISSING  # a local Hugging Face folder, e.g. /data/Qwen3-4B; nothing is fetched from a hub
