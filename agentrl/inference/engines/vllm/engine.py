"""`inference=vllm`: vLLM OpenAI servers (launched from vLLM's own venv, or running ones) as an engine.

The session server calls `generate(prompt_ids, ...)` exactly as it calls `EmbeddedEngine`: our session server
renders the chat, records the turns and parses tool calls, so multi-turn masks stay exact; each call goes token
ids in to the least busy server's `/inference/v1/generate` and comes back as a `Completion` (the sampled ids incl.
the stop token, their logprobs after temperature (`--logprobs-mode processed_logprobs`), the weight version that
sampled them as the server reports it).

Weights. `update_weights(state_dict_or_folder)` closes admission, lets the running calls finish on the old
weights, saves a state dict as a safetensors folder, then on every server reloads the weights in place from that
folder (`/collective_rpc reload_weights`), drops the prefix cache (its KV was computed by the old weights), sets
the version and reads it back from `/weight_info`: a server that holds anything else fails the push. Only then
does admission re-open, so no rollout of the next step samples from older weights than the trainer allows.

Partial rollouts (`trainer.partial_rollouts=true`: `update_weights(..., mode="keep")`) skip the drain: each server
freezes its running replies (`/pause?mode=keep`), reloads, drops its prefix cache with the frozen replies' KV
(`reset_running_requests`: they are recomputed under the new weights when they go on), sets the version and
resumes (`/resume`). A reply then spans versions; vLLM reports them as spans, read back per token
(`Completion.token_versions`).

Faults. A watcher asks every server's `/health` each `health_every_s` and watches launched processes: a dead
server sets `failure` (the session server's `/health` then answers 503 naming it, and the run's breaker stops
the run) unless `restart`, which starts it again on the same port with the current weights; calls cut by the
death wait for the restart and are sent again, so no rollout is lost.

LoRA. Built with `lora` (the run's `model.lora`, push=adapter), launched servers serve adapters (`--enable-lora`,
VLLM_ALLOW_RUNTIME_LORA_UPDATING). `update_adapter(peft_state_dict, lora)` saves only the adapter as a PEFT folder,
loads it on every server under a new name per version (`/v1/load_lora_adapter`; the old one is then unloaded, and
no prefix-cache entry of it is reused: vLLM keys the cache by adapter), and routes every later call to it (the
generate body's `model`); the version is set and read back as for a full push. The base is never re-sent. A model
folder that is an adapter folder (a LoRA run's warm start or checkpoint) serves its base with that adapter.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.config.inference import VLLMInferenceConfig as V  # the defaults' one home
from agentrl.inference.engines.completion import Completion, EngineUnavailable
from agentrl.inference.engines.remote_adapters import START_ADAPTER, adapter_folder
from agentrl.inference.engines.server_backed import Admission, LoopClients
from agentrl.inference.engines.vllm.generate import sampling_params, to_completion
from agentrl.inference.engines.vllm.servers import (
    ServerProcess,
    VLLMError,
    free_port,
    healthy,
    launch_command,
    launch_envs,
    server_env,
    vllm_python,
    wait_healthy,
)
from agentrl.inference.engines.weight_folders import folder_bytes, made_here, weights_folder

__all__ = ["VLLMEngine", "VLLMError"]

log = logging.getLogger(__name__)

MISSES_TO_FAIL = 3  # /health not answering this many times in a row: the server is gone (one miss is load)


class VLLMEngine:
    """vLLM servers as an engine. `urls` non-empty: use those (any host); else launch `num_servers` here."""

    KEEPS_RUNNING_ON_PUSH = True  # update_weights(mode="keep"): each server swaps under its running replies
    KEEPS_RUNNING_ON_ADAPTER_PUSH = False  # a running reply keeps the adapter it was admitted with

    def __init__(self, model_path: str | Path, urls: list[str] | tuple[str, ...] = (),
                 num_servers: int = V.num_servers, base_port: int = V.base_port, python: str | None = None,
                 dtype: str = V.dtype, enforce_eager: bool = V.enforce_eager, max_model_len: int | None = None,
                 kv_cache_gib: int = V.kv_cache_gib, server_env: Mapping[str, str] | None = None,
                 weights_dir: str | None = None, launch_timeout: float = V.launch_timeout,
                 request_timeout: float = V.request_timeout, health_every_s: float = V.health_every_s,
                 restart: bool = V.restart, extra_args: list[str] | tuple[str, ...] = (), seeded: bool = V.seeded,
                 log_dir: str | Path | None = None, lora: Any = None, **_: Any) -> None:
        from transformers import AutoConfig, AutoTokenizer

        from agentrl.models.lora_folder import adapter_base, folder_lora

        # An adapter folder (a LoRA run's warm start or checkpoint) is served as its base plus that adapter.
        base = adapter_base(model_path)
        start_adapter = Path(model_path) if base else None
        self.model_path = Path(base or model_path)
        if not self.model_path.is_dir():
            raise FileNotFoundError(f"VLLMEngine: model folder {self.model_path} does not exist (the session server "
                                    f"renders chats with its tokenizer, also when the servers run elsewhere)")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        config = AutoConfig.from_pretrained(self.model_path, local_files_only=True)
        self.vocab_size = int(config.vocab_size)
        self.max_context = int(max_model_len or getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.default_stop_ids = frozenset(i for i in (config.eos_token_id, self.tokenizer.eos_token_id,
                                                      self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
                                          if isinstance(i, int) and i != self.tokenizer.unk_token_id)
        self.request_timeout, self.health_every_s, self.restart = float(request_timeout), float(health_every_s), restart
        self.launch_timeout, self.seeded = float(launch_timeout), bool(seeded)
        self.weight_version = 0
        self.restarts = 0
        self._weights_root = Path(weights_dir) if weights_dir else None
        self._weights: Path | None = None  # the folder every server holds (None: the model folder)
        # model.lora when adapters are pushed (launched servers then serve them); an adapter folder served without
        # it (an eval of a LoRA run's model) brings its own settings, so the servers can load it
        self.lora = lora if lora is not None or start_adapter is None else folder_lora(start_adapter)
        self._adapter: tuple[str, Path] | None = None  # (name, folder) of the adapter every call goes to
        self.last_push_bytes = 0  # what the last push wrote for the servers to read: the adapter's, or the model's
        self._gate = Admission([], "VLLMEngine")
        self._clients = LoopClients(self.request_timeout)
        self._servers: dict[str, ServerProcess] = {}
        self._misses: dict[str, int] = {}
        if urls:
            self.urls = [u.rstrip("/") for u in urls]
            for url in self.urls:
                if not healthy(url, timeout=10):
                    raise VLLMError(f"inference.urls: the vLLM server {url} does not answer {url}/health")
                # A running server holds whatever it was started with; the trainer's start folder is what counts.
                self._load(url, self.model_path, 0)
        else:
            self.urls = self._launch(num_servers, base_port, vllm_python(python), dtype, enforce_eager,
                                     max_model_len, kv_cache_gib, server_env or {}, extra_args, log_dir)
        self._gate.in_flight = dict.fromkeys(self.urls, 0)
        if start_adapter is not None:
            name = START_ADAPTER
            for url in self.urls:
                self._load_adapter(url, name, start_adapter, None)
            self._adapter = (name, start_adapter)
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="agentrl-vllm-watch", daemon=True)
        self._watcher.start()

    @property
    def failure(self) -> EngineUnavailable | None:
        """Why the engine no longer serves (a dead server); the session server's /health reports it (503)."""
        return self._gate.failure

    # ------------------------------------------------------------------ servers

    def _launch(self, n: int, base_port: int, python: str, dtype: str, enforce_eager: bool,
                max_model_len: int | None, kv_cache_gib: int, extra_env: Mapping[str, str],
                extra_args: Any, log_dir: str | Path | None) -> list[str]:
        logs = Path(log_dir or tempfile.mkdtemp(prefix="agentrl-vllm-"))
        logs.mkdir(parents=True, exist_ok=True)
        envs = launch_envs(int(n), server_env(kv_cache_gib, extra_env, lora=self.lora is not None))
        for i, env in enumerate(envs):
            port = base_port + i if base_port else free_port()
            url = f"http://127.0.0.1:{port}"
            argv = launch_command(python, self.model_path, port, dtype=dtype, enforce_eager=enforce_eager,
                                  max_model_len=max_model_len, lora_rank=self.lora.rank if self.lora else 0,
                                  extra_args=list(extra_args))
            self._servers[url] = ServerProcess(argv, env, url, logs / f"vllm-{i}.log")
        try:
            for server in self._servers.values():
                server.start()
            wait_healthy(list(self._servers.values()), self.launch_timeout)
            for url in self._servers:
                self._set_version(url, 0)  # vLLM starts at "default"
        except BaseException:
            self._stop_servers()
            raise
        log.info("vLLM: %d server(s) up at %s (logs %s)", n, ", ".join(self._servers), logs)
        return list(self._servers)

    def _watch(self) -> None:
        """Name a dead server within seconds (or restart it); runs until `close`."""
        while not self._stop.wait(self.health_every_s):
            for url in list(self.urls):
                if url in self._gate.down or self.failure is not None:
                    continue
                server = self._servers.get(url)
                code = server.exit_code if server is not None else None
                if code is None:
                    ok = healthy(url, timeout=max(5.0, self.health_every_s))
                    self._misses[url] = 0 if ok else self._misses.get(url, 0) + 1
                    if self._misses[url] < MISSES_TO_FAIL:
                        continue
                why = f"exited with {code}" if code is not None else f"failed {url}/health {MISSES_TO_FAIL} times"
                if self.restart and server is not None:
                    self._restart(server, why)
                else:
                    tail = f" (log {server.log_path}; first error: {server.first_error()})" if server else ""
                    self._fail(EngineUnavailable(f"vLLM server {url} {why}{tail}"))

    def _fail(self, exc: EngineUnavailable) -> None:
        log.error("%s", exc)
        self._gate.fail(exc)

    def _restart(self, server: ServerProcess, why: str) -> None:
        log.warning("vLLM server %s %s: restarting it (inference.restart=true)", server.url, why)
        with self._gate.cond:
            self._gate.down.add(server.url)
        try:
            server.stop(timeout=10)
            server.start()
            wait_healthy([server], self.launch_timeout)
            self.restarts += 1
            while True:  # a push that ran meanwhile skipped this server: load whatever is current when done
                folder, version, adapter = self._weights, self.weight_version, self._adapter
                if folder is not None:
                    self._load(server.url, folder, version)
                if adapter is not None:
                    self._load_adapter(server.url, *adapter, None)
                self._set_version(server.url, version)  # a fresh start from the model folder: version 0
                with self._gate.cond:
                    if (folder, version, adapter) == (self._weights, self.weight_version, self._adapter):
                        self._gate.down.discard(server.url)
                        self._gate.cond.notify_all()
                        break
        except Exception as exc:  # noqa: BLE001 - a restart that fails is the engine's failure, named
            self._fail(EngineUnavailable(f"vLLM server {server.url} {why}, and restarting it failed: {exc}"))
            return
        self._misses[server.url] = 0
        log.warning("vLLM server %s is back (restart %d)", server.url, self.restarts)

    # ------------------------------------------------------------------ generation

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                       top_k: int = 0, stop_ids: list[int] | None = None, seed: int | None = None,
                       ignore_eos: bool = False) -> Completion:
        """Sample after `prompt_ids` on one server; same contract as `EmbeddedEngine.generate`."""
        import httpx

        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"prompt_ids must lie in [0, {self.vocab_size}); got {min(prompt)}..{max(prompt)}")
        if len(prompt) >= self.max_context:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the {self.max_context}-token context")
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if temperature < 0 or not 0.0 < top_p <= 1.0:
            raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature}, {top_p}")
        stops = sorted(set(stop_ids or ()) | (set() if ignore_eos else set(self.default_stop_ids)))
        body = {"token_ids": prompt, "sampling_params": sampling_params(
            min(int(max_tokens), self.max_context - len(prompt)), temperature, top_p, top_k, stops,
            seed if self.seeded else None, ignore_eos)}
        while True:
            url = await self._gate.acquire()
            if self._adapter is not None:  # read once admitted: only a push (admission closed) changes it
                body["model"] = self._adapter[0]
            try:
                response = await self._clients.get().post(f"{url}/inference/v1/generate", json=body)
            except httpx.TransportError as exc:
                if self.restart and url in self._servers and not self._gate.closed:
                    await asyncio.to_thread(self._await_back, url)
                    continue  # sent again once its server is back: the rollout is not lost
                raise EngineUnavailable(f"vLLM server {url} cannot be reached: {exc!r}") from exc
            finally:
                self._gate.release(url)
            if response.status_code == 200:
                return to_completion(response.json(), url, len(prompt))
            if response.status_code == 400:  # e.g. a parameter vLLM refuses: the request's fault
                raise ValueError(f"vLLM server {url} refused the request: {response.text[:300]}")
            raise VLLMError(f"{url}/inference/v1/generate answered {response.status_code}: {response.text[:500]}")

    def _await_back(self, url: str) -> None:
        """Wait until the watcher has noticed `url` died and restarted it (or the engine failed)."""
        deadline = time.monotonic() + self.launch_timeout + 10 * self.health_every_s * MISSES_TO_FAIL
        while time.monotonic() < deadline and self.failure is None and not self._gate.closed:
            if url not in self._gate.down and healthy(url):
                return
            time.sleep(self.health_every_s)

    # ------------------------------------------------------------------ weights

    def update_weights(self, source: Mapping[str, Any] | str | Path, *, timeout: float | None = None,
                       mode: str = "wait") -> int:
        """Push new weights to every server; returns the new weight version, read back. `mode="wait"`: between two
        steps (admission closed, the calls in flight finish on the old weights); `mode="keep"` (partial
        rollouts): each server freezes its running replies, swaps the weights and goes on with them."""
        if mode not in ("wait", "keep"):
            raise ValueError(f"update_weights mode must be wait or keep, got {mode!r}")
        if mode == "keep" and self._gate.failure is not None:  # (paused() raises it for a wait)
            raise self._gate.failure
        folder = weights_folder(source, self.model_path, "vLLM", self._weights_root)
        version = self.weight_version + 1
        load = self._load if mode == "wait" else self._load_kept
        with (self._gate.paused(timeout) if mode == "wait" else contextlib.nullcontext(),
              concurrent.futures.ThreadPoolExecutor(len(self.urls)) as pool):
            for f in [pool.submit(load, u, folder, version) for u in self.urls if u not in self._gate.down]:
                f.result()
        old, self._weights, self.weight_version = self._weights, folder, version
        self.last_push_bytes = folder_bytes(folder)
        if old != folder and made_here(old):
            shutil.rmtree(old, ignore_errors=True)
        return version

    def update_adapter(self, adapter: Mapping[str, Any], lora: Any, *, timeout: float | None = None,
                       **_: Any) -> int:
        """Push a LoRA adapter (`peft.get_peft_model_state_dict`, of `lora`'s rank) to every server, the base
        untouched; later calls sample with it. Returns the new weight version, read back from each server."""
        if self.lora is None and self._servers:
            raise VLLMError("update_adapter: these vLLM servers were launched without LoRA (the engine was built "
                            "without model.lora: set model.lora.enabled=true with model.lora.push=adapter)")
        folder = adapter_folder(adapter, lora, self.model_path, self._weights_root)
        version = self.weight_version + 1
        name, old = f"agentrl-lora-v{version}", self._adapter
        try:
            with self._gate.paused(timeout), concurrent.futures.ThreadPoolExecutor(len(self.urls)) as pool:
                up = [u for u in self.urls if u not in self._gate.down]
                for f in [pool.submit(self._load_adapter, u, name, folder, old[0] if old else None) for u in up]:
                    f.result()
                for f in [pool.submit(self._set_version, u, version) for u in up]:
                    f.result()
                self._adapter, self.weight_version = (name, folder), version
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self.last_push_bytes = folder_bytes(folder)
        if old is not None and made_here(old[1]):
            shutil.rmtree(old[1], ignore_errors=True)
        return version

    def _load_adapter(self, url: str, name: str, folder: Path, old: str | None) -> None:
        """Load the adapter in `folder` as `name` on one server, then unload `old` (a server holds one)."""
        self._post(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        if old is not None and old != name:
            self._post(url, "/v1/unload_lora_adapter", {"lora_name": old})

    def _post(self, url: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        import httpx

        r = httpx.post(f"{url}{path}", json=payload, timeout=self.launch_timeout, trust_env=False)
        if r.status_code != 200:
            hint = " (was it started with VLLM_SERVER_DEV_MODE=1?)" if r.status_code == 404 else ""
            raise VLLMError(f"{url}{path} answered {r.status_code}{hint}: {r.text[:300]}")
        if not r.content:
            return None
        # The adapter routes answer plain text ("Success: ..."), the RL routes JSON.
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text

    def _load(self, url: str, folder: Path, version: int) -> None:
        """Reload `folder` in place on one server, drop its prefix cache, set `version` and read it back."""
        self._post(url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
        if not (self._post(url, "/reset_prefix_cache") or {}).get("success", True):
            raise VLLMError(f"{url} kept its prefix cache after the weights in {folder} (blocks still held)")
        self._set_version(url, version)

    def _load_kept(self, url: str, folder: Path, version: int) -> None:
        """`_load` without draining: `/pause?mode=keep` freezes the running replies and queues new ones; the reload,
        the cache reset and the version land while nothing steps, so every token after `/resume` is the new
        version's. The reset preempts the frozen replies (their blocks hold the old weights' KV, and a reset that
        left them would fail): vLLM recomputes their KV under the new weights when they resume, a prefill each,
        where the embedded engine keeps its old cache."""
        self._post(url, "/pause?mode=keep")
        try:
            self._post(url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
            if not (self._post(url, "/reset_prefix_cache?reset_running_requests=true") or {}).get("success", True):
                raise VLLMError(f"{url} kept its prefix cache after the weights in {folder} (blocks still held)")
            self._set_version(url, version)
        finally:
            self._post(url, "/resume")

    def _set_version(self, url: str, version: int) -> None:
        """Label the server's weights `version` and read the label back: the version is checked, not assumed."""
        import httpx

        self._post(url, "/update_weight_version", {"new_version": str(version)})
        r = httpx.get(f"{url}/weight_info", timeout=30, trust_env=False)
        held = r.json().get("weight_version") if r.status_code == 200 else r.text[:200]
        if str(held) != str(version):
            raise VLLMError(f"{url} holds weight version {held!r}, not the {version} just pushed")

    # ------------------------------------------------------------------ lifetime

    def _stop_servers(self) -> None:
        for server in self._servers.values():
            server.stop()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the watcher and the servers this engine launched (not given URLs); pending calls fail."""
        self._gate.close()
        self._stop.set()
        self._stop_servers()
        if made_here(self._weights):
            shutil.rmtree(self._weights, ignore_errors=True)
        if self._adapter is not None and made_here(self._adapter[1]):
            shutil.rmtree(self._adapter[1], ignore_errors=True)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
