"""The embedded engine in a child process of its own (`inference.process=true`).

Why. In one process the engine's decode passes and the learner's backward passes share one Python interpreter
and one torch thread pool, so on a small CPU box they take turns. In a child process each gets its own cores:
the child runs `EmbeddedEngine` with `inference.process_threads` torch threads (0: half the cores), the trainer
keeps the rest (`trainer.threads`); the plan's `threads` line prints both.

The session server goes there too (`serve_sessions`, what the trainers start): its HTTP, chat rendering and
tokenizing would otherwise share the learner's interpreter (its GIL) and core. Only the agent loop, the env
server and the learner stay in the parent.

How. The parent (`ProcessEngine`) keeps a tokenizer (for callers that render chats here) and talks to the
child over one pipe: generate / cancel / update_weights / stats / serve, each answered by id. Weights travel as
a saved safetensors folder (as vLLM's do), written next to nothing the caller owns and deleted after the child loaded it.
The child dies with the run: it exits when the pipe closes (the parent exited) and asks the kernel to kill it
when the parent dies (PR_SET_PDEATHSIG). A child that dies is named at once: every waiting call and every later
one fails with `EngineUnavailable` naming its exit code, and `failure` makes an in-parent session server's
/health 503; a session server in the child goes with it (its port refuses), which the trainer's dependency
watch names as the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing as mp
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.child_process import die_with_parent
from agentrl.config.inference import EmbeddedInferenceConfig as Embedded  # the defaults' one home
from agentrl.devices import engine_threads
from agentrl.inference.engines.completion import Completion, EngineStats, EngineUnavailable, resolve
from agentrl.inference.engines.protocol import builds
from agentrl.inference.engines.weight_folders import made_here, weights_folder

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0  # loading a model folder in the child (a loaded box, a large model)


class ProcessEngine:
    """`EmbeddedEngine` served from a child process; the same calls (`generate`, `update_weights`, `stats`,
    `weight_version`, `failure`, `close`)."""

    KEEPS_RUNNING_ON_PUSH = True  # the child's EmbeddedEngine's (engines.protocol.Engine)
    KEEPS_RUNNING_ON_ADAPTER_PUSH = True

    def __init__(self, model_path: str | Path, threads: int = 0, **engine_kwargs: Any) -> None:
        from transformers import AutoTokenizer

        self.model_path = Path(model_path)
        if not self.model_path.is_dir():
            raise FileNotFoundError(f"ProcessEngine: model folder {self.model_path} does not exist")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        self.threads = engine_threads(threads)
        self.weight_version = 0
        self.failure: EngineUnavailable | None = None
        self._ids = itertools.count()
        self._waiting: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()  # guards _waiting and failure; the reader takes it for a moment per reply
        # Sends have their own lock: a large send (an adapter) under _lock would stop the reader from taking
        # replies, the child's replies would fill the pipe and block its engine, and no one would read our send.
        self._send_lock = threading.Lock()
        ctx = mp.get_context("spawn")  # no fork: the parent's threads and torch state stay out of the child
        self._conn, child_end = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, name="agentrl-engine",
                                 args=(child_end, str(self.model_path), self.threads, engine_kwargs), daemon=True)
        self._proc.start()
        child_end.close()
        if not self._conn.poll(READY_TIMEOUT_S):
            self._proc.kill()
            raise EngineUnavailable(f"the engine process did not load {self.model_path} in {READY_TIMEOUT_S:.0f} s")
        try:
            kind, info = self._conn.recv()
        except EOFError:
            self._proc.join(5)
            raise EngineUnavailable(f"the engine process died while loading {self.model_path} "
                                    f"(exit code {self._proc.exitcode})") from None
        if kind == "error":
            self._proc.join(5)
            raise info
        self.vocab_size, self.max_context = info["vocab_size"], info["max_context"]
        self.default_stop_ids = frozenset(info["default_stop_ids"])
        self.pid = self._proc.pid
        self._reader = threading.Thread(target=self._read, name="agentrl-engine-pipe", daemon=True)
        self._reader.start()
        log.info("engine process %d serves %s with %d torch threads", self.pid, self.model_path, self.threads)

    # ------------------------------------------------------------------ calls

    def _call(self, op: str, *args: Any) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self.failure is not None:
                raise self.failure
            call_id = next(self._ids)
            self._waiting[call_id] = fut
        with self._send_lock:  # a broken pipe: the reader sees EOF and fails every waiting call, this one too
            self._conn.send((call_id, op, args))
        fut.call_id = call_id  # type: ignore[attr-defined]
        return fut

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Completion:
        """Sample after `prompt_ids` in the child; same contract as `EmbeddedEngine.generate`."""
        fut = self._call("generate", [int(t) for t in prompt_ids], kw)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            with self._lock:
                alive = self.failure is None
            if alive:
                with self._send_lock:
                    self._conn.send((fut.call_id, "cancel", ()))  # type: ignore[attr-defined]
            raise

    def update_weights(self, source: Mapping[str, Any] | str | Path, *, timeout: float | None = None,
                       mode: str = "wait") -> int:
        """Hand the child new weights (a state dict is saved to a folder first); returns the new version."""
        folder = weights_folder(source, self.model_path, "the engine process")
        try:
            self.weight_version = int(self._call("update_weights", str(folder), mode).result(timeout=timeout))
        finally:
            if made_here(folder):
                shutil.rmtree(folder, ignore_errors=True)
        return self.weight_version

    def update_adapter(self, adapter: Mapping[str, Any], lora: Any, *, timeout: float | None = None,
                       mode: str = "wait") -> int:
        """Hand the child a LoRA adapter (`EmbeddedEngine.update_adapter`); it is small, so it goes over the pipe."""
        arrays = {k: v.detach().to("cpu").float().numpy() for k, v in adapter.items()}  # plain pickles, no shm
        self.weight_version = int(self._call("update_adapter", arrays, lora, mode).result(timeout=timeout))
        return self.weight_version

    def serve_sessions(self, start: Callable[..., Any], *, host: str = "127.0.0.1", port: int = 0,
                       **options: Any) -> ChildSessionServer:
        """Start a session server (`start(engine, host=, port=, **options)`: `start_session_server`, which the
        caller names so that the engines import no session server) in the child, over the child's engine; returns
        once it accepts connections. It stops with the child (`close`)."""
        url = self._call("serve", start, host, int(port), options).result(timeout=READY_TIMEOUT_S)
        log.info("engine process %d serves sessions at %s", self.pid, url)
        return ChildSessionServer(url)

    @property
    def stats(self) -> EngineStats:
        """The child engine's counters (`idle_fraction()` included), read now."""
        return self._call("stats").result(timeout=60)

    # ------------------------------------------------------------------ the pipe

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, value = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                fut = self._waiting.pop(call_id, None)
            if fut is not None:
                resolve(fut, value) if ok else resolve(fut, exc=value)
        # Another thread joining the child at the same moment (close(), a caller) may reap it first, and this join
        # then returns before the exit code is stored: ask again until it is there (seen as "code None" in CI).
        deadline = time.monotonic() + 5
        while self._proc.exitcode is None and time.monotonic() < deadline:
            self._proc.join(0.05)
        code = self._proc.exitcode
        self._fail(EngineUnavailable(f"the engine process (pid {self._proc.pid}) exited with code {code}"))

    def _fail(self, exc: EngineUnavailable) -> None:
        with self._lock:
            self.failure = self.failure or exc
            waiting, self._waiting = self._waiting, {}
        if not isinstance(exc, _Closed):
            log.error("%s", exc)
        for fut in waiting.values():
            resolve(fut, exc=self.failure)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the child (its running calls fail) and wait for it to exit."""
        with self._lock:
            closing = self.failure is None
            if closing:
                self.failure = _Closed("the engine process is closed")
        if closing:
            try:
                with self._send_lock:
                    self._conn.send((-1, "close", ()))
            except (OSError, BrokenPipeError):
                pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            # SIGKILL cannot be refused, but on a loaded box tearing down a torch process can take longer than a
            # few seconds (CI met 5 s): wait for it, so a closed engine's child is gone, as the caller was told
            self._proc.join(60)
        self._conn.close()

    def __enter__(self) -> ProcessEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@builds(ProcessEngine)
def embedded_engine(model_path: str | Path, process: bool = Embedded.process,
                    process_threads: int = Embedded.process_threads, **kw: Any) -> Any:
    """`inference=embedded`'s engine: `EmbeddedEngine` here, or in a child process (`inference.process`)."""
    if process:
        return ProcessEngine(model_path, threads=process_threads, **kw)
    from agentrl.inference.engines.embedded.engine import EmbeddedEngine

    return EmbeddedEngine(model_path, **kw)


class ChildSessionServer:
    """A session server running in an engine's child process: its `base_url`; `stop()` is the child's to do."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def stop(self, timeout: float = 10.0) -> None:
        """Nothing here: the child stops its server (draining the turns in flight) when the engine closes."""


class _Closed(EngineUnavailable):
    """Closed on purpose (not logged as a failure)."""


# ---------------------------------------------------------------------- the child


def _child_main(conn: Any, model_path: str, threads: int, engine_kwargs: dict[str, Any]) -> None:
    die_with_parent()
    import torch

    torch.set_num_threads(threads)
    from agentrl.inference.engines.embedded.engine import EmbeddedEngine

    try:
        engine = EmbeddedEngine(model_path, **engine_kwargs)
    except Exception as exc:  # noqa: BLE001 - the parent raises it, named
        conn.send(("error", EngineUnavailable(f"the engine process could not load {model_path}: {exc!r}")))
        return
    conn.send(("ready", {"vocab_size": engine.vocab_size, "max_context": engine.max_context,
                         "default_stop_ids": sorted(engine.default_stop_ids)}))
    send_lock = threading.Lock()
    running: dict[int, concurrent.futures.Future] = {}
    servers: list[Any] = []  # session servers started by "serve"

    def reply(call_id: int, ok: bool, value: Any) -> None:
        with send_lock:
            try:
                conn.send((call_id, ok, value))
            except (OSError, BrokenPipeError):
                pass

    def finished(call_id: int, fut: concurrent.futures.Future) -> None:
        running.pop(call_id, None)
        if fut.cancelled():
            reply(call_id, False, asyncio.CancelledError())
            return
        exc = fut.exception()
        reply(call_id, exc is None, fut.result() if exc is None else exc)

    def push(call_id: int, op: str, args: tuple) -> None:
        try:
            if op == "update_weights":
                folder, mode = args
                reply(call_id, True, engine.update_weights(folder, mode=mode))
            else:
                arrays, lora, mode = args
                adapter = {k: torch.from_numpy(v) for k, v in arrays.items()}
                reply(call_id, True, engine.update_adapter(adapter, lora, mode=mode))
        except Exception as exc:  # noqa: BLE001 - a bad update fails its caller
            reply(call_id, False, exc)

    def serve(call_id: int, start: Callable[..., Any], host: str, port: int, options: dict[str, Any]) -> None:
        try:
            servers.append(start(engine, host=host, port=port, **options))
            reply(call_id, True, servers[-1].base_url)
        except Exception as exc:  # noqa: BLE001 - a port in use fails its caller, named
            reply(call_id, False, exc)

    try:
        while True:
            try:
                call_id, op, args = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
            if op == "close":
                break
            if op == "generate":
                prompt, kw = args
                try:
                    fut = engine.submit(prompt, **kw)
                except Exception as exc:  # noqa: BLE001 - a bad request fails its caller (ValueError: HTTP 400)
                    reply(call_id, False, exc)
                    continue
                running[call_id] = fut
                fut.add_done_callback(lambda f, i=call_id: finished(i, f))
            elif op == "cancel":
                fut = running.get(call_id)
                if fut is not None:
                    fut.request.cancelled = True  # the worker drops it at its next step
            elif op in ("update_weights", "update_adapter"):
                threading.Thread(target=push, args=(call_id, op, args), daemon=True).start()  # blocks until applied
            elif op == "stats":
                reply(call_id, True, engine.stats)
            elif op == "serve":
                threading.Thread(target=serve, args=(call_id, *args), daemon=True).start()  # waits for the socket
    finally:
        for server in servers:  # first, so that the turns in flight are answered (503) before the engine goes
            server.stop()
        engine.close()
