"""Engine throughput: vLLM (CPU build) against our session server over the embedded engine, in one run.

    AGENTRL_VLLM_PYTHON="$(bash scripts/install_vllm.sh | tail -n 1)" \
        .venv/bin/python benchmarks/micro/bench_vllm.py [--sessions 1 8 32 64] [--rounds 3] [--models tiny wide]

Each engine runs in its own process and answers the same OpenAI chats over a socket: vLLM's
`/v1/chat/completions` (hermes tool parser) and our session server's `/sessions/{id}/v1/chat/completions`.
A chat is a GridSim eval day in the flagship's compact prompt with the submit_schedule tool, sampled at T=0.6 for
exactly --max-tokens tokens (ignore_eos, so both engines do the same work). For each number of concurrent
sessions, the two engines alternate for --rounds rounds (which one goes first alternates too, so a load change on
the shared box hits both); the figure is the median round's tokens/s, and the ratio is vLLM / embedded.

Models, both made locally (no download): `tiny`, the project's model (~1M parameters), and `wide`, the same
Qwen3 architecture and tokenizer at hidden 512 x 9 layers (~29M parameters), saved to a temporary folder.

Why the embedded engine slows past 32 sessions: every embedded round also reports its forward passes (from
embedded_forward_log.py): decode steps, rows per decode step, the padded cache width, ms per decode step and the
share of the round's wall time spent outside forward passes (HTTP, rendering, cache merges, sampling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agentrl.envs.gridsim.prompts import system_prompt, tool_schema, user_prompt  # noqa: E402
from agentrl.envs.gridsim.tasks import make_task  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402

TEMPERATURE = 0.6
# hidden 512, 9 layers, 8 heads (head_dim 64), 4 KV heads, MLP 1536, tied 2048-token embeddings: ~29M parameters
WIDE = {"hidden_size": 512, "num_layers": 9, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1536}


def build_models(names: list[str], work: Path) -> dict[str, str]:
    """The model folders by name; `tiny` is the project's cached one, `wide` is made under `work`."""
    paths = {}
    for name in names:
        if name == "tiny":
            paths[name] = ensure_tiny_model(str(REPO / "outputs" / "models" / "tiny-s0-h128-l4-v2048"))
        elif name == "wide":
            paths[name] = ensure_tiny_model(str(work / "wide-h512-l9"), **WIDE)
        else:
            raise SystemExit(f"--models: unknown model {name!r} (tiny, wide)")
    return paths


def parameter_count(folder: str) -> int:
    from safetensors import safe_open

    total = 0
    for f in Path(folder).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():  # noqa: SIM118  safe_open is not a Mapping
                total += math.prod(st.get_slice(key).get_shape())
    return total


def chats(n: int) -> list[list[dict[str, str]]]:
    """n GridSim eval days as the flagship's agent opens them (compact prompt)."""
    return [[{"role": "system", "content": system_prompt("compact")},
             {"role": "user", "content": user_prompt(make_task("eval", i % 200), "compact")}] for i in range(n)]


TOOLS = [tool_schema("compact")]


class Server:
    """A server process whose output goes to a log file; stopped (SIGINT, then SIGKILL) on exit."""

    def __init__(self, name: str, cmd: list[str], url: str, health: str, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.url, self.health, self.log_path = name, url, health, log_path
        self.log = open(log_path, "w")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + self.health, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise SystemExit(f"{self.name} not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_embedded(model: str, port: int, log_dir: Path) -> Server:
    cmd = [sys.executable, str(REPO / "benchmarks" / "micro" / "embedded_forward_log.py"), model, str(port)]
    return Server("embedded session server", cmd, f"http://127.0.0.1:{port}", "/health", log_dir / f"embedded-{port}.log")


def start_vllm(python: str, model: str, port: int, log_dir: Path, max_seqs: int) -> Server:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", "float32",
           "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--max-num-seqs", str(max_seqs),
           "--disable-uvicorn-access-log"]
    # A KV cache of 2 GiB holds 64 wide-model sessions many times over; the default would take far more of a
    # shared box's memory.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    return Server("vLLM server", cmd, f"http://127.0.0.1:{port}", "/health", log_dir / f"vllm-{port}.log", env)


async def run_round(engine: str, url: str, model: str, n: int, max_tokens: int) -> tuple[float, int, int]:
    """(seconds from sending n concurrent chats to the last reply, completion tokens, replies with a tool call)."""
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        if engine == "embedded":
            sids = [(await client.post("/sessions")).json()["session_id"] for _ in range(n)]
            paths = [f"/sessions/{s}/v1/chat/completions" for s in sids]
        else:
            sids, paths = [], ["/v1/chat/completions"] * n

        async def one(path: str, messages: list[dict[str, str]]) -> tuple[int, int]:
            body: dict[str, Any] = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": max_tokens,
                                    "temperature": TEMPERATURE, "ignore_eos": True}
            r = await client.post(path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{engine}: HTTP {r.status_code}: {r.text[:500]}")
            data = r.json()
            return data["usage"]["completion_tokens"], int(bool(data["choices"][0]["message"].get("tool_calls")))

        t0 = time.perf_counter()
        done = await asyncio.gather(*[one(p, m) for p, m in zip(paths, chats(n), strict=True)])
        elapsed = time.perf_counter() - t0
        for sid in sids:
            await client.delete(f"/sessions/{sid}")
    return elapsed, sum(d[0] for d in done), sum(d[1] for d in done)


def forward_summary(rows: list[list[Any]], wall: float) -> dict[str, float]:
    """What the embedded engine's forward passes did in one round."""
    decode = [r for r in rows if r[0] == "decode"]
    prefill = [r for r in rows if r[0] == "prefill"]
    in_forward = sum(r[3] for r in rows)
    return {
        "decode_steps": len(decode),
        "rows_per_decode": statistics.fmean(r[1] for r in decode) if decode else 0.0,
        "width": statistics.fmean(r[2] for r in decode) if decode else 0.0,
        "ms_per_decode": 1000 * statistics.fmean(r[3] for r in decode) if decode else 0.0,
        "prefills": len(prefill),
        "rows_per_prefill": statistics.fmean(r[1] for r in prefill) if prefill else 0.0,
        "prefill_s": sum(r[3] for r in prefill),
        "outside_forward": max(0.0, 1 - in_forward / wall),
    }


def bench_model(name: str, folder: str, args: argparse.Namespace, log_dir: Path, port: int) -> list[dict[str, Any]]:
    print(f"\n== {name}: {folder} ({parameter_count(folder) / 1e6:.1f}M parameters), load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.monotonic()
    embedded = start_embedded(folder, port, log_dir)
    vllm = start_vllm(args.vllm_python, folder, port + 1, log_dir, max(64, max(args.sessions)))
    try:
        embedded.wait_healthy(300)
        vllm.wait_healthy(args.launch_timeout)
        print(f"both servers healthy in {time.monotonic() - t0:.0f} s", flush=True)
        urls = {"embedded": embedded.url, "vllm": vllm.url}
        for engine, url in urls.items():  # first requests pay one-off costs (vLLM's warm-up took ~40 s here)
            for n in (1, 8):
                asyncio.run(run_round(engine, url, folder, n, args.max_tokens))
        httpx.get(embedded.url + "/bench/forwards", timeout=30)
        results = []
        for n in args.sessions:
            rates: dict[str, list[float]] = {"embedded": [], "vllm": []}
            calls: dict[str, list[int]] = {"embedded": [], "vllm": []}
            steps: list[dict[str, float]] = []
            for r in range(args.rounds):
                order = ["embedded", "vllm"] if r % 2 == 0 else ["vllm", "embedded"]
                for engine in order:
                    wall, tokens, tool_calls = asyncio.run(run_round(engine, urls[engine], folder, n, args.max_tokens))
                    if tokens != n * args.max_tokens:
                        raise SystemExit(f"{engine}: {tokens} tokens for {n} x {args.max_tokens}")
                    rates[engine].append(tokens / wall)
                    calls[engine].append(tool_calls)
                    if engine == "embedded":
                        rows = httpx.get(embedded.url + "/bench/forwards", timeout=30).json()["forwards"]
                        steps.append(forward_summary(rows, wall))
            emb, vl = statistics.median(rates["embedded"]), statistics.median(rates["vllm"])
            mid = sorted(steps, key=lambda s: s["ms_per_decode"])[len(steps) // 2]
            results.append({"model": name, "sessions": n, "embedded": emb, "vllm": vl, "ratio": vl / emb,
                            "embedded_rounds": rates["embedded"], "vllm_rounds": rates["vllm"],
                            "tool_calls": calls, "forwards": mid, "load": os.getloadavg()[0]})
            print(f"{name:5s} {n:3d} sessions: embedded {emb:7.0f} tok/s  vLLM {vl:7.0f} tok/s  ratio {vl / emb:5.2f}x"
                  f"  | embedded: {mid['decode_steps']} decode steps of {mid['rows_per_decode']:.1f} rows, width "
                  f"{mid['width']:.0f}, {mid['ms_per_decode']:.1f} ms each ({mid['ms_per_decode'] / max(1.0, mid['rows_per_decode']):.2f}"
                  f" ms/row); {mid['prefills']} prefills of {mid['rows_per_prefill']:.1f} rows ({mid['prefill_s']:.2f} s);"
                  f" {100 * mid['outside_forward']:.0f}% of wall outside forwards  | load {os.getloadavg()[0]:.1f}",
                  flush=True)
        return results
    finally:
        embedded.stop()
        vllm.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=os.environ.get("AGENTRL_VLLM_PYTHON"),
                    help="the vLLM venv's python (default $AGENTRL_VLLM_PYTHON; scripts/install_vllm.sh prints it)")
    ap.add_argument("--models", nargs="+", default=["tiny", "wide"])
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--port", type=int, default=27100, help="embedded on PORT, vLLM on PORT+1 (+10 per model)")
    ap.add_argument("--launch-timeout", type=float, default=600.0)
    ap.add_argument("--work-dir", default=None, help="where the wide model is made (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if not args.vllm_python or not Path(args.vllm_python).exists():
        raise SystemExit("no vLLM python: run scripts/install_vllm.sh and pass its last line as --vllm-python "
                         "(or AGENTRL_VLLM_PYTHON)")
    with tempfile.TemporaryDirectory(prefix="bench_vllm_") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        models = build_models(args.models, work)
        print(f"{args.max_tokens} tokens per chat at T={TEMPERATURE}, median of {args.rounds} rounds; "
              f"{os.cpu_count()} CPUs", flush=True)
        results = []
        for i, (name, folder) in enumerate(models.items()):
            results += bench_model(name, folder, args, Path(tmp), args.port + 10 * i)
    print("\nmodel  sessions  embedded tok/s  vLLM tok/s  vLLM/embedded")
    for r in results:
        print(f"{r['model']:5s}  {r['sessions']:8d}  {r['embedded']:14.0f}  {r['vllm']:10.0f}  {r['ratio']:12.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
