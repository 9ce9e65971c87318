"""The model passes of `EmbeddedEngine`'s worker thread: prefill (after the shared prompt prefix), decode steps,
sampling, and resolving the rows that finished.

The shared prompt prefix. A run's chats open alike (system prompt, tool schema). Its K/V is computed once and kept
between batches (`agentrl.inference.engines.embedded.prefix_cache`: the next turn, GRPO step or eval chunk runs
only what follows it), and on a CPU the rows attend to that one copy instead of each holding their own
(`agentrl.inference.engines.embedded.prefix_attention`: attention there is bound by reading the K/V). A newcomer
that shares less of the prefix gives the running rows back the columns they stop sharing.

`ModelPasses` is the part of `EmbeddedEngine` (its base class) that runs the model; the engine itself (engine.py)
admits requests, applies weight pushes between passes and owns the worker thread. Only that thread calls these.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from agentrl.inference.engines.completion import Completion, EngineStats, Request, resolve
from agentrl.inference.engines.embedded import kv_cache
from agentrl.inference.engines.embedded.batch import DecodeBatch, prefill_inputs, sample_tokens
from agentrl.inference.engines.embedded.prefix_attention import KWARG as PREFIX_KWARG
from agentrl.inference.engines.embedded.prefix_cache import (
    MIN_SHARED_PREFIX,
    PrefixCache,
    SharedPrefix,
    common_length,
    shared_prefix,
)


class ModelPasses:
    """Prefill, decode and sample on `EmbeddedEngine`'s model and running batch (its state, set by the engine)."""

    model: Any
    device: torch.device
    pad_id: int
    weight_version: int
    stats: EngineStats
    _cache_kwarg: str  # transformers 5.x renamed `past_key_values` -> `cache`
    _rng: torch.Generator
    _batch: DecodeBatch  # the running batch
    _prefixes: PrefixCache  # the shared prompt prefix, kept between batches

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any,
                 prefix: SharedPrefix | None = None) -> tuple[torch.Tensor, Any]:
        """One forward pass after `prefix` (positions 0..P-1 of every row, held once); returns the last position's
        logits [B, V] and the grown cache (the columns after the prefix)."""
        extra = {PREFIX_KWARG: prefix.kv} if prefix is not None else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
            **extra,
        )
        return out.logits[:, -1, :], getattr(out, self._cache_kwarg)

    def _prefill(self, reqs: list[Request]) -> None:
        reqs = [r for r in reqs if not (r.cancelled or r.future.cancelled())]
        if not reqs:
            return
        # A GRPO group sends one prompt n times at once: run each distinct prompt once, then give every
        # request its own copy of that row's cache (n x fewer prefill tokens; decoding is per row as before).
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(r.prompt_ids), len(distinct)) for r in reqs]
        prompts = list(distinct)
        computed = self._prefixes.computed_tokens
        prefix = self._prefix_for(prompts)
        logits, kv, mask, kept = self._prefill_rows(prompts, prefix)
        index = None
        if len(distinct) < len(reqs):
            index = torch.tensor(rows, device=self.device)
            logits, mask = logits[index], mask[index]
        self.stats.prefill_passes += 1
        self.stats.prefill_rows += len(distinct)
        if prefix is not None:
            self.stats.shared_prefix_tokens += len(prefix) * len(prompts) - (self._prefixes.computed_tokens - computed)
        tokens = self._sample(logits, reqs)
        next_pos = torch.tensor([len(r.prompt_ids) for r in reqs], device=self.device)
        self._batch.merge(reqs, kv, index, mask, next_pos, tokens, kept)
        self._retire()

    def _prefix_for(self, prompts: list[tuple[int, ...]]) -> SharedPrefix | None:
        """The prefix `prompts` share (no longer than what they share with the running batch's, so that the
        batch keeps its own), from the prefix cache; None when they share too little."""
        n = shared_prefix(prompts)
        held = self._batch.prefix
        if self._batch and held is not None and held.version == self.weight_version:
            alike = common_length(held.ids, prompts[0])
            n = min(n, alike) if alike >= MIN_SHARED_PREFIX else n  # else the batch gives its prefix up anyway
        if n < MIN_SHARED_PREFIX:
            return None
        return self._prefixes.get(prompts[0][:n], self.weight_version)

    def _compute_prefix(self, ids: Any, base: SharedPrefix | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """K/V of `base` followed by `ids`, run as one row (the prefix cache's compute)."""
        start = len(base) if base is not None else 0
        if base is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.config)
        else:
            cache = kv_cache.build([(base.kv, None)], len(ids))
        row = torch.tensor([list(ids)], device=self.device)
        mask = torch.ones((1, start + len(ids)), dtype=torch.long, device=self.device)
        _, cache = self._forward(row, mask, torch.arange(start, start + len(ids), device=self.device)[None, :], cache)
        return kv_cache.layers_of(cache)

    def _prefill_rows(self, prompts: list[tuple[int, ...]], prefix: SharedPrefix | None,
                      ) -> tuple[torch.Tensor, list, torch.Tensor, SharedPrefix | None]:
        """Prefill what follows `prefix` in each prompt (left-padded): (last logits [P, V], per-layer (keys,
        values) [P, H, W, D] of those columns, their attention mask [P, W], the prefix the rows keep apart).

        Where the batch keeps no prefix apart (a GPU: its SDPA kernels, not `prefix_attention`'s, should run), each
        row gets its own copy of the prefix as the pass's cache, and the columns returned include it."""
        from transformers import DynamicCache

        start = len(prefix) if prefix is not None else 0
        ids, mask, pos = prefill_inputs([p[start:] for p in prompts], self.pad_id, self.device)
        if prefix is None or self._batch.share_prefix:
            logits, cache = self._forward(ids, mask, pos + start, DynamicCache(config=self.model.config), prefix)
            return logits, kv_cache.layers_of(cache), mask, prefix
        copies = torch.zeros(len(prompts), dtype=torch.long, device=self.device)
        cache = kv_cache.build([(prefix.kv, copies)], ids.shape[1])
        mask = torch.cat([torch.ones((len(prompts), start), dtype=mask.dtype, device=self.device), mask], dim=1)
        logits, cache = self._forward(ids, mask, pos + start, cache)
        return logits, kv_cache.layers_of(cache), mask, None

    def _decode_step(self) -> None:
        b = self._batch
        assert b.mask is not None and b.next_pos is not None and b.last_tok is not None
        ones = torch.ones((len(b), 1), dtype=b.mask.dtype, device=self.device)
        b.mask = torch.cat([b.mask, ones], dim=1)
        logits, b.cache = self._forward(b.last_tok[:, None], b.mask, b.next_pos[:, None], b.cache, b.prefix)
        b.next_pos = b.next_pos + 1
        self.stats.decode_steps += 1
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(b))
        b.last_tok = self._sample(logits, b.reqs)
        self._retire()

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        tokens = sample_tokens(logits, reqs, self._rng)
        for r in reqs:
            r.out_versions.append(self.weight_version)
        self.stats.tokens_generated += len(reqs)
        return tokens

    def _retire(self) -> None:
        """Resolve finished or cancelled rows and drop them from the batch."""
        keep: list[int] = []
        for i, r in enumerate(self._batch.reqs):
            reason = None
            if r.out_ids[-1] in r.stop_ids:
                reason = "stop"
            elif len(r.out_ids) >= r.max_tokens:
                reason = "length"
            if r.cancelled or r.future.cancelled():
                resolve(r.future, exc=asyncio.CancelledError())
            elif reason is not None:
                self.stats.requests += 1
                self.stats.resumed_requests += int(r.out_versions[0] != r.out_versions[-1])
                done = Completion(r.out_ids, r.out_logprobs, reason, r.out_versions[0], len(r.prompt_ids),
                                  token_versions=r.out_versions)
                resolve(r.future, done)
            else:
                keep.append(i)
        self._batch.keep(keep)
