"""Issue 29, proof 1: openenv 0.10's own clients play GridSim on our server, and every reward is right.

    python benchmarks/studies/openenv_clients.py [--episodes 400] [--workers 8]

Serves GridSim (local sandbox) on real uvicorn in this process, then plays `--episodes` episodes with
`MCPToolClient` (production mode: `openenv/session/create` over HTTP `/mcp`, the WebSocket joined by
`?session_id=`, `openenv/session/close`; a fresh client per episode, so 400 episodes are 400 session
lifecycles) and as many with `GenericEnvClient` (simulation mode, `/ws`). Episodes alternate the optimal
schedule (reward 1.0) and idling (reward 0.2) over distinct days; MCPToolClient episodes alternate between
`call_tool` (tools/call over HTTP) and `step` (over the joined WebSocket). Prints the count of wrong rewards per
client, episodes/s, and the sessions and episodes left on the server afterwards (a leak shows there).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from agentrl.envs.bundles import load_bundle
from agentrl.envs.server import build_app, serve_in_background
from agentrl.testing.wait import wait_until

IDLE = [0] * 24


def tasks(bundle: Any, n: int) -> list[tuple[str, int, list[int], float]]:
    """(split, index, schedule, expected reward) for n episodes over distinct days, optimum and idling alternating."""
    days = [("eval", i) for i in range(bundle.splits()["eval"])] + [("train", i) for i in range(n)]
    out = []
    for k, (split, index) in enumerate(days[:n]):
        optimal = k % 2 == 0
        schedule = bundle.row(split, index)["optimal_schedule"] if optimal else IDLE
        out.append((split, index, schedule, 1.0 if optimal else 0.2))
    return out


async def mcp_episode(url: str, k: int, split: str, index: int, schedule: list[int]) -> float | None:
    async with MCPToolClient(base_url=url, message_timeout_s=120) as env:
        reset = await env.reset(split=split, index=index)
        assert reset.observation.metadata["task"]["index"] == index, reset
        if k % 2 == 0:  # tools/call over HTTP /mcp, bound to this client's session
            return (await env.call_tool("submit_schedule", schedule=schedule))["reward"]
        result = await env.step(CallToolAction(tool_name="submit_schedule", arguments={"schedule": schedule}))
        return result.reward


async def generic_episode(url: str, k: int, split: str, index: int, schedule: list[int]) -> float | None:
    async with GenericEnvClient(base_url=url, message_timeout_s=120) as env:
        await env.reset(split=split, index=index)
        result = await env.step({"type": "call_tool", "tool_name": "submit_schedule", "arguments": {"schedule": schedule}})
        return result.reward


async def play(url: str, episode, todo: list[tuple[str, int, list[int], float]], workers: int) -> list[str]:
    """Every task played; the wrong rewards, described."""
    queue = list(enumerate(todo))
    wrong: list[str] = []

    async def worker() -> None:
        while queue:
            k, (split, index, schedule, expected) = queue.pop()
            try:
                reward = await episode(url, k, split, index, schedule)
            except Exception as exc:  # a failed episode counts as wrong, with why
                wrong.append(f"{split}/{index}: {type(exc).__name__}: {exc}")
                continue
            if reward != expected:
                wrong.append(f"{split}/{index}: reward {reward}, expected {expected}")

    await asyncio.gather(*(worker() for _ in range(workers)))
    return wrong


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=400)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    bundle = load_bundle("gridsim")
    todo = tasks(bundle, args.episodes)
    app = build_app(bundle, max_concurrent_envs=args.workers)
    failures = 0
    with serve_in_background(app) as url:
        for name, episode in (("MCPToolClient", mcp_episode), ("GenericEnvClient", generic_episode)):
            t0 = time.monotonic()
            wrong = asyncio.run(play(url, episode, todo, args.workers))
            elapsed = time.monotonic() - t0
            # Teardown runs just after a client's close; give it a moment, then count what is left.
            wait_until(lambda: len(app.state.sessions) == 0 and not app.state.served.sessions, timeout=60)
            left = len(app.state.sessions)
            print(f"{name}: {len(todo)} episodes ({sum(t[3] == 1.0 for t in todo)} optimal -> 1.0, "
                  f"{sum(t[3] == 0.2 for t in todo)} idle -> 0.2), {len(wrong)} wrong rewards, "
                  f"{len(todo) / elapsed:.1f} episodes/s with {args.workers} at once, {left} sessions left",
                  flush=True)
            for line in wrong[:10]:
                print("   ", line)
            failures += len(wrong) + left
    print("verdict:", "PASS (0 wrong rewards, no session left)" if not failures else f"FAIL ({failures})")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
