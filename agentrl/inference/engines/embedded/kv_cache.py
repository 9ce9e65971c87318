"""The running batch's KV cache, preallocated and written in place.

transformers' `DynamicCache` grows by `torch.cat` on every forward pass: each decode step re-copies every
layer's whole K/V (at 32 rows x ~300 tokens of SmolLM2-135M, ~0.46 GB a step, 35% of a one-thread decode step,
benchmarks/micro/bench_engine_profile.py). Here each layer keeps its K/V in a buffer [B, H, capacity, D] with
room to spare: a forward pass writes its new columns in place and attends to a view of the filled ones,
`buffer[:, :, start:end]`. The buffer is copied only when rows join or leave the batch (`build`, `select`),
or when it runs out of room (it then grows by a chunk).

A row's columns are right-aligned at `end`, left-padded with zeros (never uninitialized memory: a masked
column's score must stay finite, or the softmax turns NaN), as in the engine's left-padded batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

GROW = 128  # columns added when a buffer runs out of room


class SlabLayer(DynamicLayer):
    """One layer's K/V in preallocated buffers; `keys` / `values` are views of the filled columns."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, start: int, end: int) -> None:
        super().__init__()
        self.k_buf, self.v_buf = keys, values  # [B, H, capacity, D]
        self.start, self.end = start, end
        self.device = keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self.k_buf[:, :, self.start : self.end]
        self.values = self.v_buf[:, :, self.start : self.end]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("a SlabLayer is built full, never lazily")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        if self.end + n > self.k_buf.shape[2]:
            self.reserve(self.end + n - self.start + GROW)
        self.k_buf[:, :, self.end : self.end + n].copy_(key_states)
        self.v_buf[:, :, self.end : self.end + n].copy_(value_states)
        self.end += n
        self._views()
        return self.keys, self.values

    def reserve(self, capacity: int) -> None:
        """Move the filled columns to the start of new buffers of `capacity` columns."""
        width = self.end - self.start
        k, v = (b.new_empty(b.shape[:2] + (capacity,) + b.shape[3:]) for b in (self.k_buf, self.v_buf))
        k[:, :, :width].copy_(self.keys)
        v[:, :, :width].copy_(self.values)
        self.k_buf, self.v_buf, self.start, self.end = k, v, 0, width
        self._views()


class SlabCache(DynamicCache):
    """A `DynamicCache` whose layers are `SlabLayer`s (what the model's forward pass reads and updates)."""

    def __init__(self, layers: list[SlabLayer]) -> None:
        Cache.__init__(self, layers=layers)


def build(parts: Sequence[tuple[Sequence[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]],
          headroom: int) -> SlabCache:
    """A cache holding the rows of `parts` one after another, right-aligned to a common width.

    Each part is (per-layer (keys, values) [b, H, w, D], rows): `rows` picks (and may repeat) rows of that part,
    None takes them all. The buffers get `headroom` free columns after the widest part.
    """
    counts = [len(kv[0][0]) if rows is None else len(rows) for kv, rows in parts]
    width = max(kv[0][0].shape[2] for kv, _ in parts)
    layers = []
    for i in range(len(parts[0][0])):
        bufs = []
        for j in (0, 1):  # keys, values
            ref = parts[0][0][i][j]
            buf = ref.new_empty((sum(counts), ref.shape[1], width + max(0, headroom), ref.shape[3]))
            row = 0
            for (kv, rows), n in zip(parts, counts, strict=True):
                t = kv[i][j]
                pad = width - t.shape[2]
                buf[row : row + n, :, :pad].zero_()
                buf[row : row + n, :, pad:width].copy_(t if rows is None else t.index_select(0, rows))
                row += n
            bufs.append(buf)
        layers.append(SlabLayer(bufs[0], bufs[1], 0, width))
    return SlabCache(layers)


def select(cache: SlabCache, rows: torch.Tensor, trim: int, headroom: int) -> SlabCache:
    """The cache of `rows` only, without its first `trim` columns, in new buffers with `headroom` free columns."""
    kv = [(layer.keys[:, :, trim:], layer.values[:, :, trim:]) for layer in cache.layers]
    return build([(kv, rows)], headroom)


def layers_of(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A cache's per-layer (keys, values)."""
    return [(layer.keys, layer.values) for layer in cache.layers]
