"""openenv 0.10's `MCPToolClient` against its WebSocket-only client on our env server: where an episode's time goes.

    python benchmarks/micro/bench_mcp_client.py [--episodes 200]

Our server (echo bundle, `run_server` as deployed) runs in its own process. One episode is a fresh client:
connect, reset, one `echo` call, `end_turn` (reward 1.0 checked), close. Three clients take turns, one episode
each, so load on a shared box falls on all three alike:

* `ws`: `GenericEnvClient` (simulation mode, `/ws` only);
* `mcp`: `MCPToolClient` as shipped (production mode: `openenv/session/create` over HTTP `/mcp`, `/ws` joined by
  `?session_id=`, reset there, tools called over `/mcp`, `openenv/session/close`);
* `mcp-tls`: the same, except that its httpx client reuses one TLS context (openenv builds a new one per client,
  loading the CA bundle, even for `http://`): it shows how much of `mcp`'s time is that;
* `mcp-kept`: one `MCPToolClient` kept for all its episodes (each a reset on the same session), as a user can
  do without touching openenv.

Printed per client: median and mean wall ms per episode, client and server CPU ms per episode (server CPU from
/proc, the least load-sensitive column), the ratios to `ws`, and `mcp`'s median per phase. The phases call the
client's own private steps (`_get_http_client`, `_ensure_production_session`) of openenv 0.10.0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from agentrl.http import tls_context
from agentrl.testing.processes import wait_healthy

REPO = Path(__file__).resolve().parents[2]
SERVER = """
import sys
from agentrl.envs.serve import run_server
from agentrl.envs.server import build_app
from agentrl.envs.server.echo import EchoBundle
run_server(build_app(EchoBundle(train=64, eval=64, inline=True), max_concurrent_envs=16), "127.0.0.1",
           int(sys.argv[1]), log_level="warning")
"""


class SharedTLSClient(MCPToolClient):
    """MCPToolClient whose httpx client reuses one TLS context: nothing else differs."""

    async def _get_http_client(self) -> httpx.AsyncClient:
        if self._http_client is None:
            self._http_client = httpx.AsyncClient(headers=self._headers, verify=tls_context())
        return self._http_client


async def ws_episode(url: str, index: int) -> None:
    async with GenericEnvClient(base_url=url, message_timeout_s=60) as env:
        await env.reset(split="eval", index=index)
        await env.step({"type": "call_tool", "tool_name": "echo", "arguments": {"text": "hi"}})
        end = await env.step({"type": "call_tool", "tool_name": "end_turn",
                              "arguments": {"response": f"answer-eval-{index}"}})
        assert (end.reward, end.done) == (1.0, True), end


async def mcp_episode(url: str, index: int, cls: type[MCPToolClient] = MCPToolClient) -> None:
    async with cls(base_url=url, message_timeout_s=60) as env:
        await mcp_play(env, index)


async def mcp_play(env: MCPToolClient, index: int) -> None:
    await env.reset(split="eval", index=index)
    assert await env.call_tool("echo", text="hi") == "hi"
    end = await env.call_tool("end_turn", response=f"answer-eval-{index}")
    assert (end["reward"], end["done"]) == (1.0, True), end


async def mcp_phases(url: str, index: int, phases: dict[str, list[float]]) -> None:
    """One `mcp` episode, step by step, the same calls `async with` and `call_tool` make."""
    env = MCPToolClient(base_url=url, message_timeout_s=60)
    steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("httpx client (its TLS context)", env._get_http_client),
        ("session/create over /mcp", env._ensure_production_session),
        ("join /ws?session_id=", env.connect),
        ("reset over /ws", lambda: env.reset(split="eval", index=index)),
        ("tools/call echo over /mcp", lambda: env.call_tool("echo", text="hi")),
        ("tools/call end_turn over /mcp", lambda: env.call_tool("end_turn", response=f"answer-eval-{index}")),
        ("close (/ws, session/close)", env.close),
    ]
    for name, step in steps:
        t0 = time.perf_counter()
        await step()
        phases[name].append(time.perf_counter() - t0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str, pid: int, episodes: int, warmup: int = 5) -> tuple[dict, dict]:
    reused = MCPToolClient(base_url=url, message_timeout_s=60)
    await reused.connect()
    clients: dict[str, Callable[[str, int], Awaitable[None]]] = {
        "ws": ws_episode,
        "mcp": mcp_episode,
        "mcp-tls": lambda u, i: mcp_episode(u, i, SharedTLSClient),
        "mcp-kept": lambda u, i: mcp_play(reused, i),
    }
    wall: dict[str, list[float]] = defaultdict(list)
    client_cpu: dict[str, float] = defaultdict(float)
    server_cpu: dict[str, float] = defaultdict(float)
    phases: dict[str, list[float]] = defaultdict(list)
    for k in range(warmup + episodes):
        index = k % 64
        for name, play in clients.items():
            s0, c0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
            await play(url, index)
            t1, c1, s1 = time.perf_counter(), time.process_time(), cpu_seconds(pid)
            if k >= warmup:
                wall[name].append(t1 - t0)
                client_cpu[name] += c1 - c0
                server_cpu[name] += s1 - s0
        await mcp_phases(url, index, phases if k >= warmup else defaultdict(list))
    await reused.close()
    rows = {name: (statistics.median(w), statistics.fmean(w), client_cpu[name] / len(w), server_cpu[name] / len(w))
            for name, w in wall.items()}
    return rows, {name: statistics.median(v) for name, v in phases.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=200, help="episodes per client")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        rows, phases = asyncio.run(measure(url, proc.pid, args.episodes))
    finally:
        proc.terminate()
        proc.wait(30)
    ms = 1e3
    print(f"{args.episodes} episodes per client (reset, echo, end_turn; a fresh client each but mcp-kept), one at a "
          f"time; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'client':>8} | {'median ms':>9} {'mean ms':>8} | {'client cpu':>10} {'server cpu':>10} | "
          f"{'median / ws':>11}")
    for name, (median, mean, ccpu, scpu) in rows.items():
        print(f"{name:>8} | {median * ms:9.1f} {mean * ms:8.1f} | {ccpu * ms:10.1f} {scpu * ms:10.1f} | "
              f"{median / rows['ws'][0]:10.1f}x")
    print("mcp, median ms per phase:")
    for name, median in phases.items():
        print(f"  {name:32s} {median * ms:7.2f}")
    print(f"  {'sum':32s} {sum(phases.values()) * ms:7.2f}")


if __name__ == "__main__":
    main()
