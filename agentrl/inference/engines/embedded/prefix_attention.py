"""Attention over a prompt prefix that every row of the batch shares, held once instead of once a row.

Every chat of a run opens with the same system prompt and tool schema (258 of the calc recipe's ~280 prompt
tokens with SmolLM2). With that prefix copied into each row's K/V, a decode step reads it once a row: at 32 rows
~0.4 GB a step, and on a CPU attention is then bound by that read (36% of a bf16 decode step,
benchmarks/micro/bench_engine_profile.py). vLLM's prefix cache points its rows at the same blocks, so it reads them
once from memory. Here the batch keeps the prefix's K/V once ([1, H_kv, P, D] a layer) and each row's own columns
apart; attention runs in two parts and merges them by their log-sum-exp (cascade attention):

    out = (o_prefix * exp(lse_prefix) + o_rows * exp(lse_rows)) / (exp(lse_prefix) + exp(lse_rows))

The prefix part is one attention call whose queries are every row's queries stacked, so the prefix is read once.
It is exact: the same softmax over the same columns, up to float rounding.

The model sees only the rows' own columns (its cache, mask and cache positions are the rows'); the prefix reaches
this function as the forward pass's `shared_prefix` keyword (per layer (keys, values)), which transformers hands
through to every attention call. Without it, this is transformers' own SDPA attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

IMPLEMENTATION = "agentrl_shared_prefix"  # the name the engine's model is switched to (`use_shared_prefix`)
KWARG = "shared_prefix"  # the forward pass's keyword that carries the prefix's per-layer (keys, values)


def use_shared_prefix(model: Any) -> None:
    """Switch `model` (a transformers model) to attention that takes a shared prefix; its masks stay SDPA's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, prefix_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    model.set_attn_implementation(IMPLEMENTATION)


def prefix_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: [B, H, q, D] queries over the rows' keys/values [B, H_kv, T, D] and,
    when the pass carries one, the shared prefix's; returns [B, q, H, D] as transformers' SDPA does."""
    prefix: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = kwargs.pop(KWARG, None)
    if not prefix:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    p_keys, p_values = prefix[module.layer_idx]
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = scaling if scaling is not None else d**-0.5
    grouped = query.reshape(b, kv_heads, group * q, d)  # head h reads kv head h // group: (group, q) rows a kv head
    stacked = grouped.transpose(0, 1).reshape(1, kv_heads, b * group * q, d)  # every row's queries, one "row"
    o_p, lse_p = attend(stacked, p_keys, p_values, None, scale)
    o_p = o_p.reshape(kv_heads, b, group * q, d).transpose(0, 1)
    lse_p = lse_p.reshape(kv_heads, b, group * q).transpose(0, 1)
    visible = attention_mask
    if visible is None and q > 1:  # SDPA's mask left out for a causal pass with no padding: make it
        t = key.shape[2]
        visible = torch.ones((q, t), dtype=torch.bool, device=query.device).tril(t - q)[None, None]
    elif visible is not None and visible.dtype != torch.bool:
        visible = visible == 0  # an additive mask: 0 where a column is seen
    mask = None
    if visible is not None:  # boolean [B or 1, 1, q, T] (True: attend) -> additive, repeated for the group's rows
        mask = torch.zeros(visible.shape, dtype=query.dtype, device=query.device)
        mask = mask.masked_fill_(~visible, float("-inf")).repeat(1, 1, group, 1).expand(b, -1, -1, -1)
    o_r, lse_r = attend(grouped, key, value, mask, scale)
    if visible is not None:  # a query that sees none of its row's columns (padding) sees only the prefix
        lse_r = lse_r.masked_fill(~visible.any(-1).repeat(1, 1, group), float("-inf"))
    lse = torch.logaddexp(lse_p, lse_r)
    out = o_p.float() * torch.exp(lse_p - lse)[..., None] + o_r.float() * torch.exp(lse_r - lse)[..., None]
    out = out.to(query.dtype).reshape(b, heads, q, d)
    return out.transpose(1, 2).contiguous(), None


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with its log-sum-exp: (out [B, H, q, D], lse [B, H, q] float32). `mask` is additive."""
    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, keys, values, attn_mask=mask, scale=scale)
        return out, lse.float()
    return attend_plain(query, keys, values, mask, scale)


def attend_plain(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`attend` in plain torch ops, for any device (a fully masked query gets lse -inf and zeros)."""
    scores = torch.matmul(query.float(), keys.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    return torch.matmul(weights, values.float()).to(query.dtype), lse
