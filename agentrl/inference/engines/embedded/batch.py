"""The running batch of `EmbeddedEngine`: a shared left-padded KV cache, plus token sampling.

Everything here is tensor and cache bookkeeping with no threads, queues or model: building the
left-padded prefill inputs, merging newly prefilled rows into the running batch, dropping finished
rows (and the columns that became padding for every remaining row), and sampling one token per row
with its logprob. Kept apart from `engine.py` so the scheduling there reads as scheduling, and so
these pieces can be checked on plain tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.inference.engines.completion import Request
from agentrl.inference.engines.embedded import kv_cache
from agentrl.inference.engines.embedded.prefix_cache import MIN_SHARED_PREFIX, SharedPrefix

# A temperature below this samples greedily (as SGLang's _SAMPLING_EPS): dividing float32 logits by a
# tinier one overflows to inf, and the NaN probabilities that follow would kill the engine's worker.
GREEDY_BELOW = 1e-6


class DecodeBatch:
    """The sequences decoded together and their shared cache; owned by the engine's worker thread.

    Row i of `cache`, `mask`, `next_pos` and `last_tok` belongs to `reqs[i]`. Rows are left-padded
    to a common width, so every row's newest token sits in the last column.
    """

    def __init__(self, share_prefix: bool = True) -> None:
        self.reqs: list[Request] = []
        self.cache: kv_cache.SlabCache | None = None  # preallocated, written in place (`kv_cache`)
        self.mask: torch.Tensor | None = None  # [B, L] 1 where the cache holds a real token
        self.next_pos: torch.Tensor | None = None  # [B] position id of the next token fed
        self.last_tok: torch.Tensor | None = None  # [B] sampled, not yet in the cache
        # Positions 0..P-1 of every row, held once (`prefix_attention`); `cache` and `mask` hold the columns
        # after it. None: the rows hold all their columns. `share_prefix=False` (a GPU) keeps none.
        self.prefix: SharedPrefix | None = None
        self.share_prefix = share_prefix

    def __len__(self) -> int:
        return len(self.reqs)

    def clear(self) -> None:
        """Forget every row (and free the cache)."""
        self.reqs, self.cache, self.mask, self.next_pos, self.last_tok = [], None, None, None, None
        self.prefix = None

    def merge(self, reqs: list[Request], kv: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor | None,
              mask: torch.Tensor, next_pos: torch.Tensor, last: torch.Tensor,
              prefix: SharedPrefix | None = None) -> None:
        """Add newly prefilled rows to the batch, left-padding whichever cache is shorter.

        `kv` is the prefill's per-layer (keys, values) of the columns after `prefix`; `rows` picks (and may
        repeat) its rows, one per request (None: one row each). `mask`, `next_pos` and `last` are already one row
        per request. The batch keeps apart the prefix both it and the new rows share; the columns of either
        prefix past that go into its rows.
        """
        headroom = remaining_tokens(self.reqs + reqs)
        keep = 0
        if self.share_prefix and prefix is not None:
            keep = len(prefix) if not self.reqs else prefix.shared_with(self.prefix) if self.prefix else 0
            keep = keep if keep >= MIN_SHARED_PREFIX else 0
        kv, mask = unshare(prefix, keep, kv, mask)
        if not self.reqs:
            self.cache = kv_cache.build([(kv, rows)], headroom)
            self.reqs, self.mask, self.next_pos, self.last_tok = reqs, mask, next_pos, last
            self.prefix = prefix.head(keep) if prefix is not None and keep else None
            return
        assert self.mask is not None and self.next_pos is not None and self.last_tok is not None
        own, own_mask = unshare(self.prefix, keep, kv_cache.layers_of(self.cache), self.mask)
        self.prefix = self.prefix.head(keep) if self.prefix is not None and keep else None
        width = max(own_mask.shape[1], mask.shape[1])
        self.cache = kv_cache.build([(own, None), (kv, rows)], headroom)
        self.mask = torch.cat([left_pad(own_mask, width, dim=1), left_pad(mask, width, dim=1)], dim=0)
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.last_tok = torch.cat([self.last_tok, last])
        self.reqs = self.reqs + reqs

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into `reqs`, ascending); trim columns now padding in all of them."""
        if len(rows) == len(self.reqs):
            return
        if not rows:
            self.clear()
            return
        assert self.mask is not None and self.next_pos is not None and self.last_tok is not None
        idx = torch.tensor(rows, device=self.mask.device)
        mask = self.mask[idx]
        trim = int(mask.argmax(dim=1).min())  # leading columns that are padding in every kept row
        self.reqs = [self.reqs[i] for i in rows]
        self.cache = kv_cache.select(self.cache, idx, trim, remaining_tokens(self.reqs))
        self.mask = mask[:, trim:]
        self.next_pos = self.next_pos[idx]
        self.last_tok = self.last_tok[idx]


def unshare(prefix: SharedPrefix | None, keep: int, kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
            mask: torch.Tensor) -> tuple[Sequence[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Rows `kv` / `mask` that shared `prefix` and now share only its first `keep` tokens: the rest of the prefix's
    columns copied in front of each row's own (a row's columns need not be in position order: positions live
    in the keys, and the mask says which columns are real)."""
    if prefix is None or keep >= len(prefix):
        return kv, mask
    cols = prefix.columns(keep, kv[0][0].shape[0])
    kv = [(torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)) for (ck, cv), (k, v) in zip(cols, kv, strict=True)]
    ones = torch.ones((mask.shape[0], len(prefix) - keep), dtype=mask.dtype, device=mask.device)
    return kv, torch.cat([ones, mask], dim=1)


def remaining_tokens(reqs: Sequence[Request], most: int = 512) -> int:
    """Decode steps the longest of `reqs` may still take (at most `most`): the cache's spare columns."""
    return min(most, max((r.max_tokens - len(r.out_ids) for r in reqs), default=0))


def prefill_inputs(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded `input_ids`, `attention_mask` and `position_ids` [B, max prompt length] on `device`."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def sample_tokens(logits: torch.Tensor, reqs: list[Request], rng: torch.Generator) -> torch.Tensor:
    """Sample one token per row, append it and its log_softmax(logits / T) logprob to the row's request.

    Rows without their own seeded generator draw from `rng` in one call; a temperature below
    `GREEDY_BELOW` is greedy (logprobs at T = 1). Returns the tokens [B] on `logits.device`.
    """
    logits = logits.float()
    greedy = [r.temperature < GREEDY_BELOW for r in reqs]
    temps = torch.tensor([1.0 if g else r.temperature for r, g in zip(reqs, greedy, strict=True)],
                         device=logits.device)
    scaled = logits / temps[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    filtered = filter_top_k_top_p(scaled, reqs)
    probs = (logp.exp() if filtered is scaled else torch.softmax(filtered, dim=-1)).cpu()
    tokens = torch.empty(len(reqs), dtype=torch.long)
    shared = [i for i, r in enumerate(reqs) if not greedy[i] and r.generator is None]
    if shared:
        rows = probs if len(shared) == len(reqs) else probs[shared]  # no copy in the common case
        tokens[shared] = inverse_cdf(rows, torch.rand(len(shared), generator=rng, dtype=torch.float64))
    for i, r in enumerate(reqs):
        if greedy[i]:
            tokens[i] = int(torch.argmax(filtered[i]))
        elif r.generator is not None:
            tokens[i] = int(inverse_cdf(probs[i : i + 1], torch.rand(1, generator=r.generator, dtype=torch.float64))[0])
    chosen = logp.gather(1, tokens.to(logp.device)[:, None])[:, 0].cpu().tolist()
    for r, t, lp in zip(reqs, tokens.tolist(), chosen, strict=True):
        r.out_ids.append(t)
        r.out_logprobs.append(lp)
    return tokens.to(logits.device)


CDF_BLOCK = 256  # inverse_cdf's first level: sums of this many tokens


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` [B, V] (unnormalised is fine), drawn by the uniforms `u` [B] in [0, 1).

    The first token whose cumulative probability exceeds u x the row's total: a draw from the row's distribution
    that never picks a zero-probability token. It replaces `torch.multinomial`, which spends one exponential
    random number per vocabulary entry (35 ms a decode step at 32 rows x 49,152 tokens). The cumulative sums are
    float64 (a float32 running sum over 49,152 tokens drifts by ~1e-5), taken in two levels: over blocks of
    `CDF_BLOCK` tokens, then inside the one block each row lands in (a float64 cumsum over the whole vocabulary
    took 4-8 ms a step). The draws are those of one float64 cumsum over the vocabulary.
    """
    rows, vocab = probs.shape
    pad = (-vocab) % CDF_BLOCK
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).reshape(rows, -1, CDF_BLOCK)
    block_cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)
    total = block_cdf[:, -1]
    if not bool(torch.isfinite(total).all() and (total > 0).all()):  # as torch.multinomial refuses them
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0, or sums to zero")
    target = u.to(torch.float64) * total
    block = torch.searchsorted(block_cdf, target[:, None], right=True)[:, 0].clamp_(max=blocks.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    inner = blocks[torch.arange(rows), block].to(torch.float64).cumsum(-1)  # [B, CDF_BLOCK]
    j = torch.searchsorted(inner, (target - before)[:, None], right=True)[:, 0]
    last_positive = (inner < inner[:, -1:]).sum(-1)  # rounding may overshoot the block: its last token with mass
    j = torch.where(j >= CDF_BLOCK, last_positive, j)
    return (block * CDF_BLOCK + j).clamp_(max=vocab - 1)


def left_pad(t: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """`t` with zeros prepended along `dim` up to `width` (unchanged when already that wide)."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def filter_top_k_top_p(scaled: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf (rows without filters untouched)."""
    if all(r.top_k <= 0 and r.top_p >= 1.0 for r in reqs):
        return scaled
    vocab = scaled.shape[-1]
    ks = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in reqs], device=scaled.device)
    ps = torch.tensor([r.top_p for r in reqs], device=scaled.device, dtype=scaled.dtype)
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device)[None, :]
    drop = ranks >= ks[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens; the best token is always kept
    drop |= before >= ps[:, None]
    drop[:, 0] = False  # the best token survives even a top_p that rounds to 0 in float32
    out = torch.full_like(scaled, float("-inf"))
    return out.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
