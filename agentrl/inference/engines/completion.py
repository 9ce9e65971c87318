"""What goes into and comes out of `EmbeddedEngine`: the per-request state, the `Completion` it
resolves to and the engine's work counters.

Separate from `engine.py` so the batch helpers in `batch.py` and other engines (`sglang.py` returns
the same `Completion`) can use these types without importing the engine's worker machinery.

Log-probabilities. `Completion.logprobs[i]` is `log_softmax(logits / T)[token_i]`, computed in float32
from the logits of the forward pass that sampled the token, where T is the request's temperature
(T = 1 when greedy: temperature 0, or below `batch.GREEDY_BELOW`). It is the untruncated
temperature-scaled distribution: top-k / top-p restrict which tokens may be sampled but do not
renormalise the reported logprob, so it is exactly the log pi_theta(token) at temperature T that a
GRPO trainer recomputes for its ratio.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any

import torch


class EngineUnavailable(RuntimeError):
    """The engine cannot serve: its worker died (the message names the cause) or it was closed (HTTP 503)."""


@dataclass
class Completion:
    """What one `generate` call returns. `token_ids` includes the stop token when there is one."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token was sampled) | "length" (max_tokens or the context ran out)
    weight_version: int = 0  # the version that sampled the first token (the one staleness is counted from)
    prompt_tokens: int = 0
    # One version per token: a push in keep mode lands mid-reply, so a reply may span versions. Empty means
    # every token was sampled by `weight_version` (engines that report one version per reply).
    token_versions: list[int] = field(default_factory=list)

    def versions(self) -> list[int]:
        """The version that sampled each token."""
        return list(self.token_versions) or [self.weight_version] * len(self.token_ids)


@dataclass
class EngineStats:
    """Counters that show how much work was shared between requests."""

    requests: int = 0  # completions returned
    tokens_generated: int = 0
    prefill_passes: int = 0  # forward passes over new prompts (one per admitted group)
    prefill_rows: int = 0  # distinct prompts those passes ran (a prompt sent n times at once runs once)
    shared_prefix_tokens: int = 0  # prompt tokens not run because prompts prefilled together opened alike
    decode_steps: int = 0  # forward passes that decode one token for every running sequence
    busy_periods: int = 0  # times the engine went from idle to busy
    max_batch_size: int = 0  # most sequences decoded in one pass
    kept_pushes: int = 0  # weight updates applied between two decode steps with sequences running (keep mode)
    resumed_requests: int = 0  # completions whose tokens span more than one weight version
    idle_s: float = 0.0  # seconds the worker waited with no sequence running (since the engine started)
    started: float = field(default_factory=time.monotonic)

    def idle_fraction(self) -> float:
        """Share of the engine's life spent with no sequence running (waiting for work)."""
        wall = time.monotonic() - self.started
        return min(1.0, self.idle_s / wall) if wall > 0 else 0.0

    @property
    def forward_passes(self) -> int:
        return self.prefill_passes + self.decode_steps


@dataclass
class Request:
    """One validated request and the tokens sampled for it so far (engine-internal)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    future: concurrent.futures.Future
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)  # the weight version that sampled each token
    cancelled: bool = False


def resolve(fut: concurrent.futures.Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Set `fut`'s result (or `exc`) unless it is already done; never raises for a finished future."""
    if fut.done():
        return
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled by the caller meanwhile
        pass


def checked_prompt(prompt_ids: list[int], vocab_size: int, max_context: int, max_tokens: int, temperature: float,
                   top_p: float) -> list[int]:
    """The prompt as ints, once the request is known to be valid; ValueError names what is wrong."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("prompt_ids is empty")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise ValueError(f"prompt_ids must lie in [0, {vocab_size}); got {min(prompt)}..{max(prompt)}")
    if len(prompt) >= max_context:
        raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the {max_context}-token context")
    if int(max_tokens) < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return prompt


def default_stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """The ids that end a reply unless `ignore_eos`: the configs' EOS ids, the tokenizer's EOS and <|im_end|>."""
    ids: set[int] = set()
    for src in (model.generation_config, model.config):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return ids
