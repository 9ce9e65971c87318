"""The training forward pass: logits only where a loss needs them, a prompt shared by the batch run once.

Both savings matter most for the tiny model on GridSim: a compact transcript is ~180 tokens, of which ~110 are
the system prompt and tool schema every transcript shares and only ~35 are the reply the loss covers.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from agentrl.devices import autocast, model_autocast
from agentrl.trainers.common.trained_model import checkpointing

# A shared prefix shorter than this is not worth a second forward call.
MIN_SHARED_PREFIX = 16


def first_loss_column(mask: torch.Tensor) -> int:
    """The first column of a (batch, positions) mask where any row is on (0 when none is)."""
    cols = mask.reshape(mask.shape[0], -1).any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else 0


def shared_prefix_length(ids: torch.Tensor, attn: torch.Tensor) -> int:
    """How many leading tokens every row of a right-padded batch has in common (real tokens only)."""
    if ids.shape[0] < 2:
        return 0
    same = (ids == ids[:1]).all(dim=0) & attn.bool().all(dim=0)
    differs = (~same).nonzero()
    return int(differs[0]) if len(differs) else ids.shape[1]


def next_token_logits(model: Any, ids: torch.Tensor, attn: torch.Tensor, start: int,
                      share_prefix: bool = True) -> torch.Tensor:
    """Logits at positions start..width-2 of a right-padded batch: the ones predicting tokens start+1..width-1.

    Positions before `start` feed attention but get no vocabulary-wide head. With `share_prefix`, the leading
    tokens all rows share (up to `start`) run once, at batch size 1, and their key/value cache is repeated
    across the batch; gradients flow back through the repeat, so the loss and its gradient are those of the
    plain forward pass (to float rounding). It runs under the model's `model.autocast` (bf16 on CUDA by default).
    """
    with autocast(ids.device, model_autocast(model)):  # bf16 matmuls; the master weights keep their dtype
        return _next_token_logits(model, ids, attn, start, share_prefix)


def _next_token_logits(model: Any, ids: torch.Tensor, attn: torch.Tensor, start: int,
                       share_prefix: bool) -> torch.Tensor:
    width = ids.shape[1]
    start = max(0, min(int(start), width - 1))
    # Gradient checkpointing keeps no KV cache while training, so the prefix cannot be shared then.
    share_prefix = share_prefix and not (model.training and checkpointing(model))
    prefix = min(shared_prefix_length(ids, attn), start) if share_prefix else 0
    if prefix < MIN_SHARED_PREFIX:
        return model(input_ids=ids, attention_mask=attn, logits_to_keep=width - start).logits[:, :-1]
    head = model(input_ids=ids[:1, :prefix], use_cache=True, logits_to_keep=1)
    cache = head.get("cache")  # transformers 5.2x renamed `past_key_values`
    if cache is None:
        cache = head.past_key_values
    cache.batch_repeat_interleave(ids.shape[0])
    out = model(input_ids=ids[:, prefix:], attention_mask=attn, use_cache=True, logits_to_keep=width - start,
                **{_cache_argument(model): cache})
    return out.logits[:, :-1]


def _cache_argument(model: Any) -> str:
    # A PEFT wrapper's forward takes **kwargs and hands them to the base model: ask the base which name it takes.
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
