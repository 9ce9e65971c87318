"""Env server throughput and step latency: ours vs openenv 0.10.0's own server, same echo env.

    python benchmarks/micro/bench_env_server.py [--seconds 3] [--sessions 1,8,64]

Each server runs in its own process on loopback uvicorn; one client process drives N concurrent
WebSocket sessions with identical raw frames. An episode is reset, 8 `echo` tool calls, `end_turn`.
Printed: episodes/s and p50/p99 step (tool call) latency per server and session count, the ratios
ours/openenv, and GridSim's step latency with the local sandbox (reset, submit the optimum).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from websockets.asyncio.client import connect

from agentrl.testing.processes import wait_healthy

REPO = Path(__file__).resolve().parents[2]
STEPS = 8

# Both echo servers run on uvicorn's legacy `websockets` protocol, like for like: openenv-core 0.3's server
# stalled on uvicorn 0.54's default (websockets-sansio) under concurrent sessions (a reply never arrived).
OURS = """
import sys
import uvicorn
from agentrl.envs.server import build_app
from agentrl.envs.server.echo import EchoBundle
app = build_app(EchoBundle(train=64, eval=64, inline=True), max_concurrent_envs=128)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", ws="websockets")
"""

# GridSim as deployed: `run_server`, uvicorn's default WebSocket protocol.
GRIDSIM = """
import sys
from agentrl.envs.bundles import load_bundle
from agentrl.envs.serve import run_server
from agentrl.envs.server import build_app
run_server(build_app(load_bundle("gridsim"), max_concurrent_envs=128), "127.0.0.1", int(sys.argv[1]),
           log_level="warning")
"""

# The same echo env written against openenv's own Environment interface and create_app (0.10's server).
OPENENV = """
import sys, uuid
import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction,
                                               ListToolsObservation, Tool)
from openenv.core.env_server.types import Observation, State

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

class Echo(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, split=None, index=None, **kw):
        self._state = State(episode_id=uuid.uuid4().hex, step_count=0)
        return Observation(metadata={"prompt": f"Task {split}-{index}", "system_prompt": "test"})

    def step(self, action, timeout_s=None, **kw):
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=[Tool(name="echo", description="Echo.", input_schema=SCHEMA)])
        self._state.step_count += 1
        if action.tool_name == "end_turn":
            return CallToolObservation(tool_name="end_turn", done=True, reward=1.0, metadata={"scores": {"match": 1.0}})
        text = action.arguments.get("text", "")
        result = {"content": [{"type": "text", "text": text}], "structured_content": None, "meta": None,
                  "data": text, "is_error": False}
        return CallToolObservation(tool_name=action.tool_name, result=result)

    @property
    def state(self):
        return self._state

app = create_app(Echo, CallToolAction, CallToolObservation, env_name="echo", max_concurrent_envs=128)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", ws="websockets")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(code: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


async def session(url: str, sid: int, deadline: float, lat: list[float], plan) -> int:
    """Play episodes back to back until `deadline`; returns how many finished."""
    episodes = 0
    async with connect(url.replace("http", "ws") + "/ws", compression=None, max_size=2**24,
                       ping_interval=None) as ws:
        while time.monotonic() < deadline:
            split, index, steps, final = plan(sid, episodes)
            await ws.send(json.dumps({"type": "reset", "data": {"split": split, "index": index}}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 60))["data"]["done"] is False
            for name, args in steps:
                frame = json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": args}})
                t0 = time.perf_counter()
                await ws.send(frame)
                reply = await asyncio.wait_for(ws.recv(), 60)
                lat.append(time.perf_counter() - t0)
            data = json.loads(reply)["data"]
            assert data["done"] and data["reward"] == final, data
            episodes += 1
        await ws.send(json.dumps({"type": "close"}))
    return episodes


def echo_plan(sid: int, n: int):
    steps = [("echo", {"text": f"hello {i}"}) for i in range(STEPS)] + [("end_turn", {"response": ""})]
    return "train", sid % 64, steps, None  # reward checked per server below


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux), robust to other load on the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str, pid: int, sessions: int, seconds: float, plan) -> dict[str, float]:
    lat: list[float] = []
    await asyncio.gather(*(session(url, i, time.monotonic() + 0.3, [], plan) for i in range(sessions)))  # warm-up
    t0, cpu0 = time.monotonic(), cpu_seconds(pid)
    counts = await asyncio.gather(*(session(url, i, t0 + seconds, lat, plan) for i in range(sessions)))
    elapsed, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
    lat.sort()
    print(f"  {url} x{sessions}: {sum(counts) / elapsed:.1f} episodes/s", file=sys.stderr, flush=True)
    return {
        "eps": sum(counts) / elapsed,
        "cpu_ms": cpu / max(1, sum(counts)) * 1e3,  # server CPU per episode
        "p50": lat[len(lat) // 2] * 1e3,
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--sessions", default="1,8,64")
    args = ap.parse_args()
    levels = [int(x) for x in args.sessions.split(",")]
    procs = {name: start(code) for name, code in (("ours", OURS), ("openenv", OPENENV), ("gridsim", GRIDSIM))}
    try:
        for proc, url in procs.values():
            wait_healthy(proc, url, timeout=120)
        results: dict[str, dict[int, dict[str, float]]] = {}
        rewards = {"ours": 0.0, "openenv": 1.0}  # the echo bundle scores the empty reply 0; openenv's echo says 1
        for name in ("ours", "openenv"):
            url = procs[name][1]

            def plan(sid, n, r=rewards[name]):
                split, index, steps, _ = echo_plan(sid, n)
                return split, index, steps, r

            results[name] = {n: asyncio.run(measure(url, procs[name][0].pid, n, args.seconds, plan)) for n in levels}

        from agentrl.envs.bundles import load_bundle

        grid = load_bundle("gridsim")
        schedules = [grid.row("eval", i)["optimal_schedule"] for i in range(200)]

        def grid_plan(sid, n):
            i = (sid * 7 + n) % 200
            return "eval", i, [("submit_schedule", {"schedule": schedules[i]})], 1.0

        gridsim = {n: asyncio.run(measure(procs["gridsim"][1], procs["gridsim"][0].pid, n, args.seconds, grid_plan)) for n in levels}
    finally:
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(f"echo env, episode = reset + {STEPS} tool calls + end_turn; {args.seconds:g}s per point; "
          f"{os.cpu_count()} CPUs")
    print("cpu = server CPU ms per episode (load-independent); ratios are openenv/ours for latency and CPU")
    print(f"{'sessions':>8} | {'ours ep/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'cpu':>5} | {'openenv ep/s':>12} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'cpu':>5} | {'throughput x':>12} {'p99 x':>6} {'cpu x':>6}")
    for n in levels:
        o, b = results["ours"][n], results["openenv"][n]
        print(f"{n:>8} | {o['eps']:>9.1f} {o['p50']:>7.2f} {o['p99']:>7.2f} {o['cpu_ms']:>5.2f} | {b['eps']:>12.1f} "
              f"{b['p50']:>7.2f} {b['p99']:>7.2f} {b['cpu_ms']:>5.2f} | {o['eps'] / b['eps']:>11.2f}x "
              f"{b['p99'] / o['p99']:>5.2f}x {b['cpu_ms'] / o['cpu_ms']:>5.2f}x")
    print("gridsim, local sandbox, episode = reset + submit the optimum (reward 1.0)")
    for n in levels:
        g = gridsim[n]
        flag = "ok" if g["p99"] < 10 else "OVER 10 ms"
        print(f"{n:>8} | {g['eps']:>9.1f} ep/s  step p50 {g['p50']:.2f} ms  p99 {g['p99']:.2f} ms ({flag})  "
              f"server cpu {g['cpu_ms']:.2f} ms/episode")
    ratio = results["ours"][max(levels)]["eps"] / results["openenv"][max(levels)]["eps"]
    cpu_ratio = results["openenv"][max(levels)]["cpu_ms"] / results["ours"][max(levels)]["cpu_ms"]
    print(f"at {max(levels)} sessions: throughput {ratio:.2f}x, server CPU per episode {cpu_ratio:.2f}x less "
          "(goal >= 2x)")


if __name__ == "__main__":
    main()
