"""Embedded engine behind the HTTP session server vs plain batched `model.generate`, one process.

    python benchmarks/micro/bench_inference.py                       # tiny model, CPU
    python benchmarks/micro/bench_inference.py --device cuda         # one GPU (bfloat16)

For 1, 8 and 32 concurrent sessions: each session sends one chat completion of exactly
--max-tokens tokens (ignore_eos) through the session server over a real socket; the baseline is
`model.generate` over the same prompts, left-padded in one batch, same length, sampling at T=1.
Prints throughput (tokens/s) and the ratio engine/generate (goal at 32 sessions: >= 0.8), the
session server's own overhead per request (round trip minus engine time, multi-turn sessions,
p50/p99) and the peak memory.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agentrl.inference.engines.embedded.engine import EmbeddedEngine  # noqa: E402
from agentrl.inference.sessions.server import start_session_server  # noqa: E402


def tiny_model_path() -> str:
    from agentrl.config.locate import project_root
    from agentrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(str(project_root() / "outputs" / "models" / "tiny-s0-h128-l4-v2048"))


def conversations(n: int) -> list[list[dict]]:
    return [[{"role": "system", "content": "You move a robot on a grid."},
             {"role": "user", "content": f"Robot {i}: reach cell ({i % 7}, {i % 5}) from the origin."}]
            for i in range(n)]


def bench_generate(engine: EmbeddedEngine, n: int, max_tokens: int) -> float:
    """Seconds for plain batched model.generate of the n prompts, exactly max_tokens new tokens each."""
    tok, model = engine.tokenizer, engine.model
    prompts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in conversations(n)]
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(engine.device)
    sync(engine)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id)
    sync(engine)
    elapsed = time.perf_counter() - t0
    assert out.shape[1] - batch["input_ids"].shape[1] == max_tokens
    return elapsed


async def bench_sessions(base_url: str, n: int, max_tokens: int) -> float:
    """Seconds from sending n concurrent chat completions (one per session) to the last reply."""
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        sids = [(await client.post("/sessions")).json()["session_id"] for _ in range(n)]

        async def one(sid: str, messages: list[dict]) -> int:
            r = await client.post(f"/sessions/{sid}/v1/chat/completions",
                                  json={"messages": messages, "max_tokens": max_tokens, "ignore_eos": True})
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        counts = await asyncio.gather(*[one(s, m) for s, m in zip(sids, conversations(n), strict=True)])
        elapsed = time.perf_counter() - t0
        for sid in sids:
            await client.delete(f"/sessions/{sid}")
    assert counts == [max_tokens] * n
    return elapsed


class TimedEngine:
    """Forwards to the engine and records how long each generate took (to isolate server overhead)."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.tokenizer, self.model_path = engine, engine.tokenizer, engine.model_path
        self.times: list[float] = []

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, prompt_ids, **kw):
        t0 = time.perf_counter()
        try:
            return await self.engine.generate(prompt_ids, **kw)
        finally:
            self.times.append(time.perf_counter() - t0)


async def bench_overhead(base_url: str, timed: TimedEngine, sessions: int, turns: int) -> list[float]:
    """Per-request (round trip - engine time) over sequential multi-turn sessions with tool results."""
    overheads = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        for i in range(sessions):
            sid = (await client.post("/sessions")).json()["session_id"]
            messages = list(conversations(i + 1)[-1])
            for t in range(turns):
                before = len(timed.times)
                t0 = time.perf_counter()
                r = await client.post(f"/sessions/{sid}/v1/chat/completions",
                                      json={"messages": messages, "max_tokens": 2, "ignore_eos": True})
                rtt = time.perf_counter() - t0
                r.raise_for_status()
                assert len(timed.times) == before + 1
                overheads.append(rtt - timed.times[-1])
                # a user message: the tiny model's replies make no tool call for a tool message to answer
                messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"result {t}"}]
            await client.delete(f"/sessions/{sid}")
    return overheads


def sync(engine: EmbeddedEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="a local HF folder (default: the tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5, help="best of N runs for each figure")
    args = ap.parse_args()

    path = args.model_path or tiny_model_path()
    engine = EmbeddedEngine(path, device=args.device, max_batch_sequences=max(64, max(args.sessions)))
    timed = TimedEngine(engine)
    server = start_session_server(engine, port=0)
    timed_server = start_session_server(timed, engine.tokenizer, port=0)
    print(f"model {path} on {args.device} ({engine.dtype}), torch threads {torch.get_num_threads()}, "
          f"{args.max_tokens} tokens per session, best of {args.repeats}")
    print(f"{'sessions':>8} {'generate tok/s':>15} {'sessions tok/s':>15} {'ratio':>7} {'decode steps':>13}")
    try:
        bench_generate(engine, 2, 4)  # warm up both paths
        asyncio.run(bench_sessions(server.base_url, 2, 4))
        for n in args.sessions:
            gens, srvs = [], []
            steps0 = engine.stats.decode_steps
            for _ in range(args.repeats):  # interleaved, so both see the same background load
                gens.append(bench_generate(engine, n, args.max_tokens))
                srvs.append(asyncio.run(bench_sessions(server.base_url, n, args.max_tokens)))
            steps = (engine.stats.decode_steps - steps0) / args.repeats
            gen, srv, tokens = min(gens), min(srvs), n * args.max_tokens
            print(f"{n:>8} {tokens / gen:>15.0f} {tokens / srv:>15.0f} {gen / srv:>7.2f} {steps:>13.0f}")
        over = asyncio.run(bench_overhead(timed_server.base_url, timed, sessions=10, turns=5))
        print(f"session-server overhead per request (5-turn sessions, n={len(over)}): "
              f"p50 {1000 * statistics.median(over):.2f} ms, p99 {1000 * percentile(over, 0.99):.2f} ms")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        line = f"peak RSS of the whole benchmark process {rss:.0f} MiB"
        if engine.device.type == "cuda":
            line += f", peak CUDA memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
        print(line)
    finally:
        server.stop()
        timed_server.stop()
        engine.close()


if __name__ == "__main__":
    main()
