"""The session server under a 2 MB request while 32 normal sessions run (issue 26).

    python benchmarks/micro/bench_big_request.py                  # tiny model with a 262,144-token context, CPU
    PYTHONPATH=/path/to/old/checkout python benchmarks/micro/bench_big_request.py   # the same against other code

`python -m agentrl.inference.serve` runs in its own process over the tiny model made with a 262,144-token
context, so a 2 MB prompt passes the length precheck and is really tokenized (seconds of work, then
refused: it is 1.4M tokens). 32 sessions play multi-turn conversations (`--max-tokens` tokens a turn)
for `--seconds`, twice in one run: alone, then while one client sends the 2 MB prompt again and again.
A prober calls `/health` every 50 ms throughout. Prints the normal turns' p50/p99 latency in each
phase and their ratio (with / without), and `/health` latency in each phase (`--sessions 0`: `/health`
against the 2 MB body alone). `--body values` sends a 2 MB body of a million JSON numbers instead (seconds
of validating, then served).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CONTEXT = 1 << 18
TWO_MB = 1 << 21


def long_context_model() -> str:
    from agentrl.config.locate import project_root
    from agentrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(str(project_root() / "outputs" / "models" / "tiny-s0-h128-l4-v2048-ctx262144"),
                             max_position_embeddings=CONTEXT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def session_loop(client: httpx.AsyncClient, i: int, stop: float, max_tokens: int, out: list[float]) -> None:
    """One agent: new sessions of up to 3 turns, back to back, until `stop`; each turn's latency into `out`."""
    while time.monotonic() < stop:
        sid = (await client.post("/sessions")).json()["session_id"]
        messages = [{"role": "user", "content": f"Robot {i}: reach cell ({i % 7}, {i % 5})."}]
        for turn in range(3):
            t0 = time.perf_counter()
            r = await client.post(f"/sessions/{sid}/v1/chat/completions",
                                  json={"messages": messages, "max_tokens": max_tokens, "temperature": 1.0})
            if r.status_code != 200:
                raise RuntimeError(f"a normal turn failed: {r.status_code} {r.text[:200]}")
            out.append(time.perf_counter() - t0)
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"step {turn}"}]
            if time.monotonic() >= stop:
                break
        await client.delete(f"/sessions/{sid}")


async def prober(client: httpx.AsyncClient, stop: float, out: list[float]) -> None:
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        r = await client.get("/health")
        out.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text
        await asyncio.sleep(0.05)


async def big_sender(client: httpx.AsyncClient, stop: float, body: bytes, out: list[tuple[float, int, str]]) -> None:
    while time.monotonic() < stop:
        sid = (await client.post("/sessions")).json()["session_id"]
        t0 = time.perf_counter()
        r = await client.post(f"/sessions/{sid}/v1/chat/completions", content=body,
                              headers={"content-type": "application/json"})
        out.append((time.perf_counter() - t0, r.status_code, r.text[:160]))


async def phase(base: str, sessions: int, seconds: float, max_tokens: int, big: bytes | None) -> dict:
    limits = httpx.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client, \
            httpx.AsyncClient(base_url=base, timeout=600) as side:
        stop = time.monotonic() + seconds
        turns: list[float] = []
        health: list[float] = []
        bigs: list[tuple[float, int, str]] = []
        jobs = [session_loop(client, i, stop, max_tokens, turns) for i in range(sessions)]
        jobs.append(prober(side, stop, health))
        if big is not None:
            jobs.append(big_sender(side, stop, big, bigs))
        await asyncio.gather(*jobs)
    return {"turns": turns, "health": health, "bigs": bigs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--body", choices=("digits", "values"), default="digits",
                        help="digits: one 2 MB message (tokenized, then refused); values: a 2 MB body of a "
                             "million JSON numbers (validated, then served)")
    args = parser.parse_args()

    model = long_context_model()
    rng = random.Random(0)
    digits = "".join(rng.choice("0123456789 ") for _ in range(TWO_MB))  # tokenizes for seconds, no panic
    big = ('{"messages": [{"role": "user", "content": "' + digits + '"}]}').encode()
    if args.body == "values":
        big = ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "x": ['
               + ",".join(["0"] * (TWO_MB // 2)) + "]}").encode()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    home = REPO / "outputs" / "bench_big_request"
    env = dict(os.environ, AGENTRL_HOME=str(home))
    server = subprocess.Popen([sys.executable, "-m", "agentrl.inference.serve", "model=hf", f"model.path={model}",
                               f"port={port}", "log_level=warning"], cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the session server did not start")
            time.sleep(0.2)
        asyncio.run(phase(base, args.sessions, 5.0, args.max_tokens, None))  # warm-up
        alone = asyncio.run(phase(base, args.sessions, args.seconds, args.max_tokens, None))
        loaded = asyncio.run(phase(base, args.sessions, args.seconds, args.max_tokens, big))
    finally:
        server.terminate()
        server.wait(60)

    print(f"{args.sessions} sessions, {args.max_tokens} tokens a turn, {args.seconds:.0f} s a phase; "
          f"big body ({args.body}) {len(big)} bytes")
    for name, res in (("alone", alone), ("with 2 MB", loaded)):
        t, h = res["turns"] or [float("nan")], res["health"]
        print(f"  {name:10s} turns {len(res['turns']):5d}  p50 {statistics.median(t) * 1000:7.1f} ms"
              f"  p99 {pct(t, 0.99) * 1000:7.1f} ms   /health n={len(h)} p50 {statistics.median(h) * 1000:6.1f} ms"
              f"  p99 {pct(h, 0.99) * 1000:6.1f} ms  max {max(h) * 1000:6.1f} ms")
    bigs = loaded["bigs"]
    if bigs:
        print(f"  2 MB requests: {len(bigs)}, each {statistics.median([b[0] for b in bigs]):.1f} s (median); "
              f"answers {sorted({b[1] for b in bigs})}: {bigs[0][2]}")
    ratio = pct(loaded["turns"], 0.99) / pct(alone["turns"], 0.99)
    print(f"p99 of normal turns, with / without the 2 MB body: {ratio:.2f}x")


if __name__ == "__main__":
    main()
