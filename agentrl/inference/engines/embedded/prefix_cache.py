"""The prompt prefix the engine's rows share, and the one-entry cache that keeps it between batches.

A run's chats open alike (system prompt, tool schema): the engine computes that prefix's K/V once, keeps it
apart from the rows' own columns (`prefix_attention`), and keeps it after the batch ends, so the next turn, the
next GRPO step and the next eval chunk run only what follows it. The cache holds one prefix, the last one
computed; a prefix that opens like it reuses its columns and runs only the rest. New weights make it stale:
it is never used across a weight version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [rows, H_kv, columns, D]
MIN_SHARED_PREFIX = 16  # fewer tokens alike are not worth a prefix of their own: the rows keep them


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every prompt shares, leaving each at least one token of its own."""
    low, high = min(prompts), max(prompts)  # the lexicographic extremes share what every prompt shares
    return min(common_length(low, high), min(len(p) for p in prompts) - 1)


@dataclass(frozen=True)
class SharedPrefix:
    """Token ids at positions 0..P-1 of every row, their K/V once ([1, H_kv, P, D] a layer), and the weight
    version that computed them."""

    ids: tuple[int, ...]
    kv: KV
    version: int

    def __len__(self) -> int:
        return len(self.ids)

    def head(self, n: int) -> SharedPrefix:
        """The first `n` tokens' prefix (views, no copy)."""
        return SharedPrefix(self.ids[:n], [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv], self.version)

    def columns(self, start: int, rows: int) -> KV:
        """Columns `start`.. of the prefix, one copy for each of `rows` rows (what a row holds once it stops
        sharing them)."""
        return [(k[:, :, start:].expand(rows, -1, -1, -1), v[:, :, start:].expand(rows, -1, -1, -1))
                for k, v in self.kv]

    def shared_with(self, other: SharedPrefix | None) -> int:
        """How many leading tokens this prefix and `other` share with the same K/V (0 across weight versions)."""
        if other is None or other.version != self.version:
            return 0
        return common_length(self.ids, other.ids)


class PrefixCache:
    """One computed prefix, kept between batches; `get` reuses as much of it as a new prefix opens with.

    `compute(ids, base)` runs `ids` as one row after `base` (a SharedPrefix of the tokens before them, or None)
    and returns the per-layer K/V of base + ids.
    """

    def __init__(self, compute: Callable[[Sequence[int], SharedPrefix | None], KV]) -> None:
        self._compute = compute
        self._last: SharedPrefix | None = None
        self.computed_tokens = 0  # prefix tokens run so far (the rest came from the cache)

    def get(self, ids: Sequence[int], version: int) -> SharedPrefix:
        """The prefix of `ids` under weight `version`, computing only what the kept prefix lacks."""
        ids = tuple(ids)
        last = self._last if self._last is not None and self._last.version == version else None
        reuse = common_length(last.ids, ids) if last is not None else 0
        if last is not None and reuse == len(ids):
            return last.head(reuse)
        base = last.head(reuse) if last is not None and reuse > 0 else None
        kv = self._compute(ids[reuse:], base)
        self.computed_tokens += len(ids) - reuse
        self._last = SharedPrefix(ids, kv, version)
        return self._last

    def clear(self) -> None:
        self._last = None
