"""`inference=sglang`: SGLang servers (one per GPU, or running ones) behind the embedded engine's interface.

The session server calls `generate(prompt_ids, ...)` exactly as it calls `EmbeddedEngine`; each call
goes to the least busy SGLang server's `/generate` with the prompt's token ids, and comes back as a
`Completion` (token ids incl. the stop token, sampling logprobs, finish reason, weight version).

Weights. `update_weights(folder_or_state_dict)` closes admission, waits for the running calls to finish
on the old weights, POSTs `/update_weights_from_disk` to every server (a state dict is first saved as a
safetensors folder beside the model's config), then re-opens admission: no rollout of the next step
can start before every server holds the new weights, and none of this step's is cut short.

LoRA. Built with `lora` (the run's `model.lora`, push=adapter), launched servers serve adapters (`--enable-lora`,
`--max-lora-rank`, `--lora-target-modules`); `update_adapter(peft_state_dict, lora)` saves only the adapter as a
PEFT folder, loads it under a new name per version (`/load_lora_adapter`, the old one unloaded), sets the version
(`/update_weight_version`, read back from `/model_info`) and sends every later call to it (`lora_path`). A model
folder that is an adapter folder starts the servers on its base with that adapter (`--lora-paths`). Unverified
here (SGLang needs a GPU): the dry run shows the launch command.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.config.inference import SGLangInferenceConfig as SGLang  # the defaults' one home
from agentrl.inference.engines.completion import Completion
from agentrl.inference.engines.remote_adapters import START_ADAPTER, adapter_folder
from agentrl.inference.engines.server_backed import Admission, LoopClients
from agentrl.inference.engines.weight_folders import folder_bytes, made_here, weights_folder

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
    """An SGLang server failed to start, answered an error, or refused new weights."""


def launch_commands(model_path: str | Path, *, num_gpus: int = 1, base_port: int = 30000,
                    mem_fraction_static: float = 0.7, tool_call_parser: str | None = "qwen25",
                    reasoning_parser: str | None = None, extra_args: list[str] | tuple[str, ...] = (),
                    python: str = sys.executable, server_host: str = "127.0.0.1", lora: Any = None,
                    start_adapter: str | Path | None = None) -> list[tuple[list[str], dict]]:
    """(argv, extra environment) for each server: one per GPU, pinned with CUDA_VISIBLE_DEVICES. `lora`
    (`model.lora`): serve adapters of its rank and modules, starting with `start_adapter` when given."""
    if num_gpus < 1:
        raise ValueError(f"inference.num_gpus must be >= 1, got {num_gpus}")
    if not 0 < mem_fraction_static < 1:
        raise ValueError(f"inference.mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
    out = []
    for gpu in range(num_gpus):
        argv = [python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", server_host,
                "--port", str(base_port + gpu), "--mem-fraction-static", str(mem_fraction_static),
                "--weight-version", "0"]
        if tool_call_parser:
            argv += ["--tool-call-parser", tool_call_parser]
        if reasoning_parser:
            argv += ["--reasoning-parser", reasoning_parser]
        if lora is not None:  # one adapter at a time: a push replaces the last
            argv += ["--enable-lora", "--max-lora-rank", str(lora.rank), "--max-loras-per-batch", "1",
                     "--lora-target-modules", *lora.target_modules]
            if start_adapter is not None:
                argv += ["--lora-paths", f"{START_ADAPTER}={start_adapter}"]
        out.append(([*argv, *map(str, extra_args)], {"CUDA_VISIBLE_DEVICES": str(gpu)}))
    return out


def sampling_params(max_tokens: int, temperature: float, top_p: float, top_k: int, stop_ids: list[int] | None,
                    seed: int | None, ignore_eos: bool) -> dict[str, Any]:
    """SGLang's sampling parameters for one call (stop tokens are kept in the output, as the engine's are)."""
    params: dict[str, Any] = {"max_new_tokens": int(max_tokens), "temperature": float(temperature),
                              "top_p": float(top_p), "top_k": int(top_k) if top_k and top_k > 0 else -1,
                              "ignore_eos": bool(ignore_eos), "skip_special_tokens": False, "no_stop_trim": True}
    if stop_ids:
        params["stop_token_ids"] = [int(s) for s in stop_ids]
    if seed is not None:
        params["sampling_seed"] = int(seed)
    return params


def to_completion(body: dict[str, Any], fallback_version: int) -> Completion:
    """A `Completion` from SGLang's /generate answer (meta_info.output_token_logprobs = [[logprob, id, _], ...])."""
    meta = body.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    if not isinstance(pairs, list):
        raise SGLangError("SGLang's /generate answer has no meta_info.output_token_logprobs (return_logprob lost?)")
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    if kind == "abort":
        raise SGLangError(f"SGLang aborted the request: {reason}")
    version = meta.get("weight_version")
    try:
        version = int(version)
    except (TypeError, ValueError):
        version = fallback_version
    return Completion(token_ids=[int(p[1]) for p in pairs], logprobs=[float(p[0]) for p in pairs],
                      finish_reason="stop" if kind == "stop" else "length", weight_version=version,
                      prompt_tokens=int(meta.get("prompt_tokens") or 0))


def launch_note(settings: Any) -> str | None:
    """The dry run's line: the command the first SGLang server would be launched with (None: running servers)."""
    import shlex

    from agentrl.models.lora_folder import adapter_base

    s = settings.inference
    if s.urls:
        return None
    lora = settings.model.lora
    lora = lora if lora.enabled and lora.push == "adapter" else None
    path = str(s.model_path)
    try:
        base = adapter_base(path) if lora else None
    except ValueError:
        base = None
    argv, env = launch_commands(base or path, num_gpus=s.num_gpus, base_port=s.base_port,
                                mem_fraction_static=s.mem_fraction_static, tool_call_parser=s.tool_call_parser,
                                reasoning_parser=s.reasoning_parser, extra_args=s.extra_args, python="python",
                                lora=lora, start_adapter=path if base else None)[0]
    return f"sglang server 0 of {s.num_gpus}: " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(argv)


class SGLangEngine:
    """SGLang servers as an engine. `urls` non-empty: use those servers; else launch one per GPU."""

    KEEPS_RUNNING_ON_PUSH = False  # a push waits for the running replies (engines.protocol.Engine)
    KEEPS_RUNNING_ON_ADAPTER_PUSH = False

    def __init__(self, model_path: str | Path, urls: list[str] | tuple[str, ...] = (), num_gpus: int = SGLang.num_gpus,
                 base_port: int = SGLang.base_port, mem_fraction_static: float = SGLang.mem_fraction_static,
                 tool_call_parser: str | None = SGLang.tool_call_parser, reasoning_parser: str | None = None,
                 launch_timeout: float = SGLang.launch_timeout, request_timeout: float = SGLang.request_timeout,
                 extra_args: list[str] | tuple[str, ...] = (), log_dir: str | Path | None = None, lora: Any = None,
                 **_: Any) -> None:
        from transformers import AutoTokenizer

        from agentrl.models.lora_folder import adapter_base, folder_lora

        base = adapter_base(model_path)  # an adapter folder: its base, served with that adapter
        self.model_path = Path(base or model_path)
        lora = lora if lora is not None or not base else folder_lora(model_path)  # its own settings, as vLLM's
        self.lora = lora
        self._adapter: str | None = START_ADAPTER if base else None  # the adapter every call goes to
        self.last_push_bytes = 0
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.request_timeout = float(request_timeout)
        self.default_stop_ids = frozenset(i for i in (self.tokenizer.eos_token_id,
                                                      self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
                                          if isinstance(i, int) and i != self.tokenizer.unk_token_id)
        self.weight_version = 0
        self._procs: list[subprocess.Popen] = []
        self._gate = Admission([], "SGLangEngine")
        self._clients = LoopClients(self.request_timeout)
        self._tmp_weights: list[Path] = []
        self._adapter_folder: Path | None = None  # the pushed adapter the servers hold
        if urls:
            self.urls = [u.rstrip("/") for u in urls]
        else:
            self.urls = self._launch(launch_commands(
                self.model_path, num_gpus=num_gpus, base_port=base_port, mem_fraction_static=mem_fraction_static,
                tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser, extra_args=extra_args,
                lora=lora, start_adapter=model_path if base else None), base_port, float(launch_timeout), log_dir)
        self._gate.in_flight = dict.fromkeys(self.urls, 0)

    # ------------------------------------------------------------------ servers

    def _launch(self, commands: list[tuple[list[str], dict]], base_port: int, timeout: float,
                log_dir: str | Path | None) -> list[str]:
        if importlib_missing("sglang"):
            raise SGLangError("inference=sglang launches `python -m sglang.launch_server` but sglang is not "
                              "installed; install it on the GPU machine or pass inference.urls=[...]")
        logs = Path(log_dir or tempfile.mkdtemp(prefix="agentrl-sglang-"))
        logs.mkdir(parents=True, exist_ok=True)
        urls = []
        for i, (argv, env) in enumerate(commands):
            out = open(logs / f"sglang-{i}.log", "w")  # noqa: SIM115 - owned by the process for its lifetime
            self._procs.append(subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{base_port + i}")
        try:
            self._wait_healthy(urls, timeout, logs)
        except BaseException:
            self.close()
            raise
        return urls

    def _wait_healthy(self, urls: list[str], timeout: float, logs: Path) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        pending = list(enumerate(urls))
        while pending:
            for i, url in list(pending):
                if self._procs[i].poll() is not None:
                    tail = (logs / f"sglang-{i}.log").read_text()[-3000:]
                    raise SGLangError(f"SGLang server {i} exited with {self._procs[i].returncode}:\n{tail}")
                try:
                    if httpx.get(f"{url}/health", timeout=5, trust_env=False).status_code == 200:
                        pending.remove((i, url))
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise SGLangError(f"SGLang servers {[u for _, u in pending]} not healthy after {timeout}s (logs {logs})")
            if pending:
                time.sleep(1.0)

    # ------------------------------------------------------------------ generation

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                       top_k: int = 0, stop_ids: list[int] | None = None, seed: int | None = None,
                       ignore_eos: bool = False) -> Completion:
        """Sample after `prompt_ids` on one server; same contract as `EmbeddedEngine.generate`."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        stops = sorted(set(stop_ids or ()) | (set() if ignore_eos else set(self.default_stop_ids)))
        body = {"input_ids": prompt, "return_logprob": True,
                "sampling_params": sampling_params(max_tokens, temperature, top_p, top_k, stops, seed, ignore_eos)}
        url = await self._gate.acquire()
        if self._adapter is not None:  # read once admitted: only a push (admission closed) changes it
            body["lora_path"] = self._adapter
        try:
            response = await self._clients.get().post(f"{url}/generate", json=body)
        finally:
            self._gate.release(url)
        if response.status_code != 200:
            raise SGLangError(f"{url}/generate answered {response.status_code}: {response.text[:500]}")
        return to_completion(response.json(), self.weight_version)

    # ------------------------------------------------------------------ weights

    def update_weights(self, source: Mapping[str, Any] | str | Path, *, timeout: float | None = None) -> int:
        """Push new weights to every server between two steps; returns the new weight version."""
        import httpx

        folder = weights_folder(source, self.model_path, "SGLang")
        if made_here(folder):
            self._tmp_weights.append(folder)
        version = self.weight_version + 1

        def push(url: str) -> None:
            r = httpx.post(f"{url}/update_weights_from_disk", timeout=timeout or 3600, trust_env=False,
                           json={"model_path": str(folder), "weight_version": str(version)})
            answer = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            if r.status_code != 200 or not answer.get("success", False):
                raise SGLangError(f"{url} refused the weights in {folder}: {r.status_code} {answer or r.text[:300]}")

        with self._gate.paused(timeout), concurrent.futures.ThreadPoolExecutor(len(self.urls)) as pool:
            for f in [pool.submit(push, u) for u in self.urls]:
                f.result()
        self.weight_version = version
        self.last_push_bytes = folder_bytes(folder)
        return version

    def update_adapter(self, adapter: Mapping[str, Any], lora: Any, *, timeout: float | None = None,
                       **_: Any) -> int:
        """Push a LoRA adapter (`peft.get_peft_model_state_dict`) to every server, the base untouched; later calls
        sample with it. Returns the new weight version, read back from each server's /model_info."""
        import httpx

        folder = adapter_folder(adapter, lora, self.model_path)
        self._tmp_weights.append(folder)
        version = self.weight_version + 1
        name, old = f"agentrl-lora-v{version}", self._adapter

        def post(url: str, path: str, payload: dict[str, Any]) -> None:
            r = httpx.post(f"{url}{path}", json=payload, timeout=timeout or 3600, trust_env=False)
            answer = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            if r.status_code != 200 or answer.get("success") is False:
                raise SGLangError(f"{url}{path} refused {payload}: {r.status_code} {answer or r.text[:300]}")

        def push(url: str) -> None:
            post(url, "/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
            if old is not None:
                post(url, "/unload_lora_adapter", {"lora_name": old})
            post(url, "/update_weight_version", {"new_version": str(version), "abort_all_requests": False})
            held = httpx.get(f"{url}/model_info", timeout=30, trust_env=False).json().get("weight_version")
            if str(held) != str(version):
                raise SGLangError(f"{url} holds weight version {held!r}, not the {version} just pushed")

        with self._gate.paused(timeout), concurrent.futures.ThreadPoolExecutor(len(self.urls)) as pool:
            for f in [pool.submit(push, u) for u in self.urls]:
                f.result()
            self._adapter, self.weight_version = name, version
        self.last_push_bytes = folder_bytes(folder)
        # the servers unloaded the previous adapter: its folder is not needed again (one a step would pile up)
        stale, self._adapter_folder = self._adapter_folder, folder
        if stale is not None:
            self._tmp_weights.remove(stale)
            shutil.rmtree(stale, ignore_errors=True)
        return version

    def close(self, timeout: float = 30.0) -> None:
        """Stop the servers this engine launched (not given URLs); pending calls fail."""
        self._gate.close()
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._procs.clear()
        for folder in self._tmp_weights:
            shutil.rmtree(folder, ignore_errors=True)
        self._tmp_weights.clear()

    def __enter__(self) -> SGLangEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None
