"""The embedded inference engine: transformers on one device, with dynamic (continuous) batching.

How batching works. One worker thread owns the model. Requests go into a queue; when the engine is
idle the first request waits up to `batch_wait_ms` for others, and all of them are prefilled in one
left-padded forward pass. Every step after that is ONE forward pass that decodes one token for every
running sequence, using a shared left-padded KV cache. Requests that arrive while a batch runs join it
between two decode steps (their prompts are prefilled together in one pass and their caches are
left-padded to the batch's length), so a session whose turn finishes early starts its next turn
without waiting for the slowest sequence. Finished sequences leave the batch at once; columns that
only hold padding for every remaining row are trimmed. A prompt sent n times at once runs once. The
cache is preallocated and written in place (`agentrl.inference.engines.embedded.kv_cache`): a decode step copies no
K/V; rows joining or leaving do.

The shared prompt prefix. A run's chats open alike (system prompt, tool schema): its K/V is computed once, kept
between batches and, on a CPU, held once for every row (`passes.py`, which has the model passes).

Log-probabilities. `Completion.logprobs[i]` is the untruncated `log_softmax(logits / T)[token_i]` of
the pass that sampled the token (T = 1 when greedy); see `agentrl.inference.engines.completion`.

Weights. `update_weights(mode="wait")` stops admitting new requests, lets the running batch finish on
the old weights, copies the new ones in place, bumps `weight_version`, then admits the queue: every
`Completion` is then produced under one weight version. `mode="keep"` (partial rollouts) does not
wait: the new weights are copied in between two decode steps and the running sequences continue on
them. Their KV cache stays as the old weights computed it (as AReaL's interruptible generation and
verl's partial rollouts do; recomputing it would cost a prefill per sequence). Each token records
the version that sampled it (`Completion.token_versions`) and its logprob is that pass's, so
importance sampling against the behaviour logprobs stays exact per token.

Scheduling lives here (admission, weight pushes, the worker thread); the model passes (prefill with the shared
prefix, decode steps, sampling, retiring rows) in `agentrl.inference.engines.embedded.passes`, which `EmbeddedEngine`
builds on; the left-padded batch and sampling in `agentrl.inference.engines.embedded.batch`; `Completion` /
`EngineStats` (re-exported here) in `agentrl.inference.engines.completion`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import queue
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from agentrl.config.inference import EmbeddedInferenceConfig as Embedded  # the defaults' one home
from agentrl.inference.engines.completion import (
    Completion,
    EngineStats,
    EngineUnavailable,
    Request,
    checked_prompt,
    default_stop_ids,
    resolve,
)
from agentrl.inference.engines.embedded import packed_linear
from agentrl.inference.engines.embedded.adapter import load_served_model
from agentrl.inference.engines.embedded.batch import DecodeBatch
from agentrl.inference.engines.embedded.passes import ModelPasses
from agentrl.inference.engines.embedded.prefix_attention import use_shared_prefix
from agentrl.inference.engines.embedded.prefix_cache import PrefixCache, shared_prefix
from agentrl.inference.engines.embedded.weights import load_state_dict, validate_state_dict

__all__ = ["Completion", "EmbeddedEngine", "EngineStats", "EngineUnavailable", "shared_prefix"]

log = logging.getLogger(__name__)

PUSH_MODES = ("wait", "keep")  # update_weights: finish the running batch first | apply between decode steps
_WAKE = object()  # queue sentinel: wakes an idle worker (a weight update or close is pending)


class EmbeddedEngine(ModelPasses):
    """A transformers model served with continuous batching from a dedicated thread.

    Args:
        model_path: a local Hugging Face folder (model + tokenizer); nothing is downloaded.
        device: "cpu" or "cuda"/"cuda:N".
        dtype: the served weights' dtype, "auto" (float32 on a CPU, bfloat16 on CUDA), "float32" or "bfloat16".
        max_batch_sequences: most sequences decoded together in one forward pass.
        batch_wait_ms: how long the first request to an idle engine waits for others to share its batch.
    Extra keyword arguments (the inference config's host/port) are accepted and ignored.
    """

    KEEPS_RUNNING_ON_PUSH = True  # update_weights(mode="keep"): applied between decode steps (engines.protocol.Engine)
    KEEPS_RUNNING_ON_ADAPTER_PUSH = True  # update_adapter(mode="keep"): its merged weights, likewise

    def __init__(
        self,
        model_path: str | Path,
        device: str = Embedded.device,
        max_batch_sequences: int = Embedded.max_batch_sequences,
        batch_wait_ms: float = Embedded.batch_wait_ms,
        dtype: str = Embedded.dtype,
        **_: Any,
    ) -> None:
        from transformers import AutoTokenizer

        path = Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(f"EmbeddedEngine: model folder {path} does not exist")
        if max_batch_sequences < 1:
            raise ValueError(f"max_batch_sequences must be >= 1, got {max_batch_sequences}")
        self.model_path = path
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype) if dtype != "auto" else \
            torch.float32 if self.device.type == "cpu" else torch.bfloat16
        self.max_batch_sequences = int(max_batch_sequences)
        self.batch_wait_s = max(0.0, float(batch_wait_ms)) / 1000.0
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        # A LoRA adapter folder serves its base with the adapter merged in (`inference/engines/embedded/adapter.py`).
        self.model, self._adapter_base = load_served_model(path, self.dtype, self.device)
        packed_linear.pack_linears(self.model)  # float32 on a CPU only: the big matrices laid out once for oneDNN
        # transformers 5.x renamed the cache argument and output field `past_key_values` -> `cache`.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        arch = self.model.config  # the model's own (transformers) config, not the run's
        if getattr(arch, "use_sliding_window", False) or "sliding_attention" in (getattr(arch, "layer_types", None) or ()):
            # the batch's shared cache is rebuilt from plain full-attention layers when rows join or leave
            raise ValueError(f"EmbeddedEngine supports full-attention models only; {path} uses sliding-window layers")
        self.vocab_size = int(arch.vocab_size)
        self.max_context = int(getattr(arch, "max_position_embeddings", 0) or 1 << 30)
        self.default_stop_ids = frozenset(default_stop_ids(self.model, self.tokenizer))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.weight_version = 0
        self.stats = EngineStats()

        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        # (state, future, keep): keep=True may be applied while sequences run (partial rollouts)
        self._pending_weights: list[tuple[dict[str, torch.Tensor], concurrent.futures.Future, bool]] = []
        self._closed = False
        self.failure: EngineUnavailable | None = None  # why the engine no longer serves (crash or close)
        self.stopped = threading.Event()  # set once the worker has exited and failed every pending request
        self._rng = torch.Generator(device="cpu")
        self._rng.seed()
        # The prompt prefix every chat opens with is computed once and kept (`prefix_cache`); on a CPU the rows
        # also attend to one copy of it (`prefix_attention`: attention there is bound by reading the K/V).
        use_shared_prefix(self.model)
        self._prefixes = PrefixCache(self._compute_prefix)
        self._batch = DecodeBatch(share_prefix=self.device.type == "cpu")  # owned by the worker thread
        self._thread = threading.Thread(target=self._worker, name="agentrl-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    def submit(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_ids: list[int] | None = None,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> concurrent.futures.Future:
        """Queue one request from any thread; the future resolves to a `Completion`.

        Raises ValueError for a bad request and `EngineUnavailable` once the engine is closed or dead.
        """
        prompt = checked_prompt(prompt_ids, self.vocab_size, self.max_context, max_tokens, temperature, top_p)
        stops = frozenset(int(s) for s in (stop_ids or ())) | (frozenset() if ignore_eos else self.default_stop_ids)
        gen = None
        if seed is not None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(int(seed))
        fut: concurrent.futures.Future = concurrent.futures.Future()
        req = Request(
            prompt_ids=prompt,
            max_tokens=min(int(max_tokens), self.max_context - len(prompt)),
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=int(top_k) if top_k and top_k > 0 else 0,
            stop_ids=stops,
            generator=gen,
            future=fut,
        )
        fut.request = req  # type: ignore[attr-defined]  # lets generate() flag a cancelled caller
        with self._lock:  # checked and queued atomically: a dying worker drains the queue after `_closed`
            if self._closed:
                raise self.failure or EngineUnavailable("EmbeddedEngine is closed")
            self._queue.put(req)
        return fut

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_ids: list[int] | None = None,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Completion:
        """Sample up to `max_tokens` tokens after `prompt_ids`; stops at EOS / <|im_end|> / `stop_ids`.

        `top_k` <= 0 and `top_p` = 1 disable those filters; `temperature` 0 is greedy. `ignore_eos`
        keeps only the explicit `stop_ids`. Raises ValueError for a bad request.
        """
        fut = self.submit(
            prompt_ids,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_ids=stop_ids,
            seed=seed,
            ignore_eos=ignore_eos,
        )
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.request.cancelled = True  # type: ignore[attr-defined]  # the worker drops it next step
            raise

    def update_weights(
        self, source: Mapping[str, torch.Tensor] | str | Path, *, timeout: float | None = None,
        mode: str = "wait",
    ) -> int:
        """Replace the weights in place; blocks until applied and returns the new `weight_version`.

        `source` is a state dict (a subset of the model's keys is fine) or a folder/file of
        safetensors (or torch .bin) weights. `mode="wait"`: the running batch finishes on the old
        weights first; `mode="keep"`: applied between two decode steps, running sequences go on.
        """
        if mode not in PUSH_MODES:
            raise ValueError(f"update_weights: mode must be one of {', '.join(PUSH_MODES)}, got {mode!r}")
        self._check_open()  # a closed engine has let its model go
        state = load_state_dict(source) if isinstance(source, str | Path) else dict(source)
        state = validate_state_dict(self.model, state, self.device, self.dtype)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise self.failure or EngineUnavailable("EmbeddedEngine is closed")
            self._pending_weights.append((state, fut, mode == "keep"))
        self._queue.put(_WAKE)
        return fut.result(timeout=timeout)

    def update_adapter(self, adapter: Mapping[str, torch.Tensor], lora: Any, *, timeout: float | None = None,
                       mode: str = "wait") -> int:
        """Serve the base with LoRA `adapter` (PEFT's tensor names; `lora`: its `model.lora` settings, rank and
        alpha) in place of the previous adapter: `update_weights` of the merged weights, computed here so the
        caller sends only the adapter. Returns the new `weight_version`."""
        self._check_open()
        merged = self._adapter_base.merged(self.model, adapter, float(lora.alpha) / int(lora.rank))
        return self.update_weights(merged, timeout=timeout, mode=mode)

    def _check_open(self) -> None:
        with self._lock:
            if self._closed:
                raise self.failure or EngineUnavailable("EmbeddedEngine is closed")

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker; requests still queued or running fail with RuntimeError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.failure = self.failure or EngineUnavailable("EmbeddedEngine is closed")
        self._queue.put(_WAKE)
        self._thread.join(timeout=timeout)
        if not self._thread.is_alive():
            # A closed engine can stay referenced long after (a stopped session app's route closures hold it):
            # its weights go now, not with the last reference (a warm start's eval engine kept 0.5 GB of SmolLM2).
            self.model = self._adapter_base = None
            self._batch = DecodeBatch()
            self._prefixes.clear()

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ worker thread

    def _worker(self) -> None:
        new: list[Request] | None = None
        try:
            with torch.inference_mode():
                while True:
                    new = self._admit()
                    if new is None:
                        break
                    if new:
                        self._prefill(new)  # admitted rows are in no batch yet: `new` still holds them
                    new = None
                    if self._batch:
                        self._decode_step()
        except BaseException as exc:  # a model failure must not leave callers waiting forever
            log.exception("engine worker crashed")
            self.failure = EngineUnavailable(f"the engine's worker died: {exc!r}")  # the cause wins over a close
            self._fail_all(self.failure, new or [])
        else:
            self._fail_all(EngineUnavailable("EmbeddedEngine is closed"), [])
        finally:
            self.stopped.set()

    def _fail_all(self, exc: EngineUnavailable, admitted: list[Request]) -> None:
        """Close admission and fail every request and weight update still waiting, with `exc`."""
        with self._lock:
            self._closed = True
            self.failure = self.failure or exc
            pending, self._pending_weights = self._pending_weights, []
        for _, fut, _ in pending:
            if not fut.done():
                fut.set_exception(exc)
        for req in admitted + self._batch.reqs:
            resolve(req.future, exc=exc)
        self._batch.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Request):
                resolve(item.future, exc=exc)

    def _admit(self) -> list[Request] | None:
        """New requests to prefill now; None when the engine is closed and idle."""
        if self._batch:
            self._apply_pending_weights(running=True)  # keep-mode pushes only: between two decode steps
            if self._pending_weights or self._closed:
                return []  # drain the running batch before swapping weights or stopping
            return self._drain(self.max_batch_sequences - len(self._batch))
        # Idle: a safe point to swap weights.
        self._apply_pending_weights()
        if self._closed:
            return None
        waited = time.monotonic()
        first = self._queue.get()
        self.stats.idle_s += time.monotonic() - waited
        if first is _WAKE:
            return []
        batch = [first]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch_sequences:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if item is _WAKE:
                self._queue.put(_WAKE)  # handle it once this batch has started
                break
            batch.append(item)
        batch += self._drain(self.max_batch_sequences - len(batch))
        self.stats.busy_periods += 1
        return batch

    def _drain(self, room: int) -> list[Request]:
        out: list[Request] = []
        while len(out) < room:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _WAKE:
                continue
            out.append(item)
        return out

    def _apply_pending_weights(self, running: bool = False) -> None:
        """Apply the queued pushes; with `running` (a batch mid-decode) only when every one of them is keep-mode,
        checked under the lock so that a wait-mode push queued meanwhile is never applied mid-batch."""
        with self._lock:
            if running and not all(keep for _, _, keep in self._pending_weights):
                return
            pending, self._pending_weights = self._pending_weights, []
        if not pending:
            return
        params = self.model.state_dict()
        for state, fut, _ in pending:
            try:
                for name, tensor in state.items():
                    params[name].copy_(tensor)
                self.weight_version += 1
                self.stats.kept_pushes += int(running)
                fut.set_result(self.weight_version)
            except Exception as exc:  # a bad update fails its caller, not the engine
                fut.set_exception(exc)
        packed_linear.repack(self.model)  # before the next forward pass, which only this thread runs
