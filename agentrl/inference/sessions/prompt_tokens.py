"""Prompts rendered and tokenized off the event loop, bounded by the model's context before the work is done.

A 2 MB message takes a tokenizer seconds (it can also panic: a Rust `PanicException` derives from
`BaseException`), and the session server's event loop also answers `/health` and every other
session. So rendering and tokenizing run on worker threads, and a prompt is refused (400) as early
as it can be known not to fit:

1. before tokenizing, by its length: no token covers more characters than the longest string in the
   vocabulary, so a text longer than `room x that` cannot fit in `room` tokens;
2. after tokenizing, by its real count.

Prompts of more than `LARGE_PROMPT_CHARS` characters get their own single thread, so they queue
behind each other and never behind normal turns. Tokenizing calls `encode_batch_fast` of the Rust
tokenizer: it releases the GIL while it works and, unlike `encode`, keeps no per-token strings or
offsets, whose deallocation would hold the GIL for a fifth of a second on a million tokens.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agentrl.inference.sessions import tito
from agentrl.inference.sessions.tito import MessageValidationError

T = TypeVar("T")

LARGE_PROMPT_CHARS = 1 << 18  # ~65k tokens of prose: above this a prompt waits in the large-prompt lane
NORMAL_WORKERS = 4


def model_context(engine: Any, tokenizer: Any) -> int | None:
    """The model's context in tokens: the engine's `max_context`, else the tokenizer's `model_max_length`."""
    # `max_context` is optional (not in the `Engine` protocol): SGLang's engine has none, so its tokenizer's counts.
    for value in (getattr(engine, "max_context", None), getattr(tokenizer, "model_max_length", None)):
        if isinstance(value, int) and 0 < value < 1 << 40:  # transformers' "unset" is 1e30
            return value
    return None


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest string: an upper bound on the text one token covers."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1


def encode_ids(tokenizer: Any, text: str) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=False)`, through the Rust tokenizer's GIL-free batch call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast"):
        return tito.encode(tokenizer, text)
    return list(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)


def _longest_message(messages: Sequence[dict[str, Any]]) -> str:
    sizes = [(len(m.get("content") or ""), i) for i, m in enumerate(messages)]
    if not sizes:
        return ""
    size, index = max(sizes)
    return f" (its longest message is messages[{index}], {size} characters)"


class PromptEncoder:
    """Renders and tokenizes prompts on worker threads; a prompt that cannot fit `room` tokens is a 400."""

    def __init__(self, tokenizer: Any, *, large_chars: int = LARGE_PROMPT_CHARS) -> None:
        self.tokenizer = tokenizer
        self.token_chars = longest_token_chars(tokenizer)
        self.large_chars = int(large_chars)
        self._pools: dict[bool, ThreadPoolExecutor] = {}  # large lane? -> its threads, made on first use
        self._lock = threading.Lock()

    async def run(self, chars: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread: the large-prompt lane when the request holds over `large_chars`."""
        large = chars > self.large_chars
        with self._lock:
            pool = self._pools.get(large)
            if pool is None:
                pool = self._pools[large] = ThreadPoolExecutor(
                    1 if large else NORMAL_WORKERS, thread_name_prefix=f"agentrl-tokenize{'-large' if large else ''}")
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))

    def encode(self, text: str, room: int | None, what: str, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Ids of `text` (`what`, e.g. "the prompt"), or MessageValidationError when it exceeds `room` tokens
        or the tokenizer fails on it. Blocking: call it through `run`."""
        if room is not None and len(text) > room * self.token_chars:
            raise MessageValidationError(
                f"{what} is too long: {len(text)} characters cannot fit in the {room} tokens the model's context "
                f"leaves (no token of this tokenizer covers more than {self.token_chars}){_longest_message(messages)}")
        try:
            ids = encode_ids(self.tokenizer, text)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - a Rust panic is a BaseException: still the input's fault
            raise MessageValidationError(
                f"the tokenizer failed on {what}{_longest_message(messages)}: {type(exc).__name__}: {exc}") from None
        if room is not None and len(ids) > room:
            raise MessageValidationError(
                f"{what} is {len(ids)} tokens; the model's context leaves room for {room}{_longest_message(messages)}")
        return ids

    def close(self) -> None:
        """Let the worker threads end once their current job does (queued jobs are dropped); a later `run`
        starts new ones, so a server can be started again."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
