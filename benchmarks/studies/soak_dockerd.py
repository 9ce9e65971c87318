"""Fault soak phase "dockerd frozen" (issue 26): how long a reset takes to fail, naming the daemon, when the Docker
daemon stops answering, and how long the env server takes to deploy again once it answers.

    python benchmarks/studies/soak.py --sandboxes "" --dockerd-frozen        # this phase alone, through the soak's CLI
    python benchmarks/studies/soak_dockerd.py --resets 8 --docker-timeout 30  # the same, on its own

The env server (`python -m agentrl.envs.serve env=gridsim sandbox=docker`, a subprocess) reaches the real Docker
daemon through a relay socket (`agentrl.testing.docker_relay`, DOCKER_HOST points at it). Once an episode has
scored, the relay freezes: it accepts every request and answers none, which is what a dockerd stopped with SIGSTOP
looks like to its clients, while the real daemon goes on serving everyone else on the machine. `--resets` resets
then start at once, each on its own session with a client `reset_timeout` of 600 s (the server's too). Reported:
seconds from the freeze to each reset's failure and whether its message names the daemon's address, seconds to
`/health`'s 503; after the thaw, seconds to a healthy `/health` and to a newly scored episode; and the containers
left once the server stopped (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import Server, containers, free_port  # noqa: E402  (benchmarks/ is not a package)


@dataclass
class FrozenDaemonReport:
    """The phase's figures (see the module docstring)."""

    docker_timeout: float | None
    resets: int
    fail_s: list[float] = field(default_factory=list)  # freeze -> each reset's failure
    named: int = 0  # failures whose message names the daemon's address
    other: list[str] = field(default_factory=list)  # resets that ended any other way
    example: str = ""  # one failure message
    health_503_s: float | None = None
    thaw_healthy_s: float | None = None
    thaw_scored_s: float | None = None
    left_behind: int = 0

    @property
    def ok(self) -> bool:
        return self.named == self.resets and not self.other and self.thaw_scored_s is not None \
            and self.left_behind == 0


async def _play(url: str, index: int) -> float | None:
    """One GridSim eval day played optimally: its reward."""
    from agentrl.envs.bundles import load_bundle
    from agentrl.envs.client import EpisodeClient

    schedule = load_bundle("gridsim").row("eval", index)["optimal_schedule"]
    async with EpisodeClient(url, reset_timeout=600) as env:
        await env.reset("eval", index)
        return (await env.call("submit_schedule", {"schedule": schedule})).reward


async def _frozen_resets(url: str, rep: FrozenDaemonReport, address: str, t0: float) -> None:
    """`rep.resets` resets at once against the frozen daemon, and /health polled until it says 503."""
    import httpx

    from agentrl.envs.client import EnvResetError, EpisodeClient

    async def reset(i: int) -> None:
        try:
            async with EpisodeClient(url, reset_timeout=600) as env:
                await env.reset("eval", 10 + i)
            rep.other.append(f"reset {i} succeeded")
        except EnvResetError as exc:
            rep.fail_s.append(time.monotonic() - t0)
            rep.named += address in str(exc)
            rep.example = rep.example or str(exc)
        except Exception as exc:
            rep.other.append(f"reset {i}: {type(exc).__name__}: {exc}")

    async def health() -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
            while (await client.get(f"{url}/health")).status_code != 503:
                await asyncio.sleep(0.25)
        rep.health_503_s = time.monotonic() - t0

    watcher = asyncio.create_task(health())
    await asyncio.gather(*(reset(i) for i in range(rep.resets)))
    try:
        await asyncio.wait_for(watcher, 60)
    except TimeoutError:
        pass


def dockerd_frozen(resets: int, docker_timeout: float | None, logs: Path) -> FrozenDaemonReport:
    """Run the phase (see the module docstring) and return its figures."""
    import httpx

    from agentrl.testing.docker_relay import DaemonRelay

    rep = FrozenDaemonReport(docker_timeout, resets)
    relay = DaemonRelay(Path(tempfile.mkdtemp(prefix="agentrl-relay-")) / "docker.sock")
    relay.start()
    port = free_port()
    argv = [sys.executable, "-m", "agentrl.envs.serve", "env=gridsim", "env.prompt_style=compact", "sandbox=docker",
            f"port={port}", "reset_timeout=600", f"max_concurrent_envs={resets + 4}", "log_level=warning"]
    if docker_timeout is not None:
        argv.append(f"sandbox.docker_timeout={docker_timeout}")
    server = Server(argv, port, logs / "env-dockerd-frozen.log", {"DOCKER_HOST": relay.address, "OMP_NUM_THREADS": "1"})
    print(f"[dockerd frozen] env server on {server.url}, daemon {relay.address}", file=sys.stderr, flush=True)
    try:
        server.start()
        assert asyncio.run(_play(server.url, 0)) == 1.0, "the episode before the freeze did not score"
        relay.freeze()
        t0 = time.monotonic()
        try:
            asyncio.run(_frozen_resets(server.url, rep, relay.address, t0))
        finally:
            relay.thaw()
        thawed = time.monotonic()
        deadline = thawed + 300
        while httpx.get(f"{server.url}/health", trust_env=False, timeout=60).status_code != 200:
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        else:
            rep.thaw_healthy_s = time.monotonic() - thawed
        if asyncio.run(_play(server.url, 1)) == 1.0:
            rep.thaw_scored_s = time.monotonic() - thawed
    finally:
        server.stop()
        relay.close()
    time.sleep(1.0)  # the last `docker rm` may still be landing
    rep.left_behind = len(containers(port))
    return rep


def table(rep: FrozenDaemonReport) -> str:
    """The phase's figures, one per line."""

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    fails = sorted(rep.fail_s)
    rows: list[tuple[str, Any]] = [
        ("sandbox.docker_timeout", "default" if rep.docker_timeout is None else f"{rep.docker_timeout:g} s"),
        ("resets while frozen (reset_timeout 600 s)", rep.resets),
        ("  failed naming the daemon", f"{rep.named}/{rep.resets}"),
        ("  freeze -> failure: min / median / max",
         " / ".join(s(v) for v in (fails[0], statistics.median(fails), fails[-1])) if fails else "-"),
        ("  ended otherwise (must be 0)", len(rep.other)),
        ("freeze -> /health 503", s(rep.health_503_s)),
        ("thaw -> /health 200", s(rep.thaw_healthy_s)),
        ("thaw -> a new episode scored", s(rep.thaw_scored_s)),
        ("CONTAINERS LEFT BEHIND (must be 0)", rep.left_behind),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}} | {value}" for name, value in rows]
    if rep.example:
        lines.append(f"the failure: {rep.example[:400]}")
    lines += [f"OTHER: {line[:300]}" for line in rep.other[:10]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resets", type=int, default=8, help="resets started at once while the daemon is frozen")
    ap.add_argument("--docker-timeout", type=float, default=None, help="sandbox.docker_timeout (default: the config's)")
    ap.add_argument("--logs", default=None, help="folder for the server's log (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="agentrl-soak-"))
    logs.mkdir(parents=True, exist_ok=True)
    rep = dockerd_frozen(args.resets, args.docker_timeout, logs)
    print(table(rep))
    if args.json:
        Path(args.json).write_text(json.dumps({**rep.__dict__, "ok": rep.ok}, indent=2))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
