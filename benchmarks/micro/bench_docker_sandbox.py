"""Docker sandbox speed: episode deploy time (cold, and from a warm pool) and 128 concurrent GridSim episodes.

    python benchmarks/micro/bench_docker_sandbox.py [--deploys 20] [--concurrent 128] [--warm-pool 4]

Needs a Docker daemon and the sandbox image (`bash .ci/setup_docker.sh`). Deploy time is `await deploy()` until
the handle is returned: container create + start + Python start + bundle load + episode creation when cold, one
round trip when a warm container takes the task. Every episode submits the optimal schedule, so a finished episode
scores exactly 1.0; anything else counts as lost.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from agentrl.envs.bundles import load_bundle
from agentrl.envs.sandbox.docker import DockerSandbox


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def play(sb: DockerSandbox, bundle, index: int, split: str = "eval") -> tuple[float, float]:
    """Deploy and play one episode to its end; returns (deploy seconds, grade)."""
    t = time.perf_counter()
    h = await sb.deploy(split, index)
    deployed = time.perf_counter() - t
    try:
        await h.first_turn()
        await h.call_tool("submit_schedule", {"schedule": bundle.row(split, index)["optimal_schedule"]})
        grade = (await h.scores()).get("grade", 0.0) if await h.done() else 0.0
    finally:
        await h.close()
    return deployed, grade


async def deploy_times(bundle, n: int, warm_pool: int) -> list[float]:
    sb = DockerSandbox(bundle.spec(), warm_pool=warm_pool)
    await sb.start()
    times = []
    try:
        for i in range(n):
            if warm_pool:  # measure a warm hit: wait until the pool has refilled after the last deploy
                while sb.warm_ready() < warm_pool:
                    await asyncio.sleep(0.02)
            deployed, grade = await play(sb, bundle, i % 200)
            assert grade == 1.0, grade
            times.append(deployed)
    finally:
        await sb.shutdown()
    return times


async def round_trips(bundle, n: int) -> list[float]:
    """Seconds per request on a live episode (`scores()`: one JSON line each way, nothing to compute)."""
    sb = DockerSandbox(bundle.spec())
    await sb.start()
    try:
        h = await sb.deploy("eval", 0)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await h.scores()
            times.append(time.perf_counter() - t)
        await h.close()
    finally:
        await sb.shutdown()
    return times


async def concurrent(bundle, n: int) -> tuple[int, float, list[float]]:
    sb = DockerSandbox(bundle.spec())
    await sb.start()
    try:
        t = time.perf_counter()
        results = await asyncio.gather(*(play(sb, bundle, i % 200) for i in range(n)), return_exceptions=True)
        wall = time.perf_counter() - t
    finally:
        await sb.shutdown()
    ok = [r for r in results if isinstance(r, tuple) and r[1] == 1.0]
    for r in results:
        if isinstance(r, BaseException):
            print(f"  lost: {type(r).__name__}: {r}")
    return len(ok), wall, [r[0] for r in ok]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deploys", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=128)
    parser.add_argument("--warm-pool", type=int, default=4)
    args = parser.parse_args()
    bundle = load_bundle("gridsim")

    cold = await deploy_times(bundle, args.deploys, 0)
    warm = await deploy_times(bundle, args.deploys, args.warm_pool)
    print(f"deploy, cold ({args.deploys} sequential):  median {statistics.median(cold) * 1e3:7.1f} ms   "
          f"p95 {pct(cold, 0.95) * 1e3:7.1f} ms")
    print(f"deploy, warm pool of {args.warm_pool}:        median {statistics.median(warm) * 1e3:7.1f} ms   "
          f"p95 {pct(warm, 0.95) * 1e3:7.1f} ms")
    print(f"cold/warm median ratio: {statistics.median(cold) / statistics.median(warm):.0f}x")
    rtt = await round_trips(bundle, 500)
    print(f"one episode call (round trip, 500 calls): median {statistics.median(rtt) * 1e6:.0f} us   "
          f"p95 {pct(rtt, 0.95) * 1e6:.0f} us")

    done, wall, deploys = await concurrent(bundle, args.concurrent)
    print(f"{args.concurrent} concurrent GridSim episodes: {done} finished with grade 1.0, "
          f"{args.concurrent - done} lost, wall {wall:.1f} s ({done / wall:.1f} episodes/s); "
          f"deploy under that load median {statistics.median(deploys):.1f} s, p95 {pct(deploys, 0.95):.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
