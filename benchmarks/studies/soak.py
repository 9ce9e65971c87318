"""Fault soak: GridSim episodes through the real agent, session server and env server while faults are injected.

    python benchmarks/studies/soak.py                                   # the issue's size: 1,000 episodes x 64, both sandboxes
    python benchmarks/studies/soak.py --episodes 48 --concurrency 8     # a CI-sized run
    python benchmarks/studies/soak.py --sandboxes local --model scripted  # no model: a scripted chat server stands in

Each pass (one per sandbox) plays `--episodes` GridSim train days, `--concurrency` at a time, with
`agentrl.agents.episode.play_episode` against a session server (`python -m agentrl.inference.serve`, a
subprocess, over the tiny model or `--model PATH`) and an env server (`python -m agentrl.envs.serve`, a subprocess).
Faults, on a schedule:

* local pass: episodes whose code raises when the task is deployed (`deploy`) or on its first tool call or turn end
  (`env_error`), episodes whose first call sleeps past `--tool-timeout` (`tool_timeout`), and the env server killed
  with SIGKILL once `--kill-at` of the episodes are done, restarted on the same port after `--down-s` seconds;
* docker pass: the same kill and restart, and `--container-kills` containers killed (`docker kill`) under live
  episodes.

An episode is *affected* when a fault was scheduled for it, or the server kill or a container kill fell inside its
lifetime. Reported per pass: episodes that scored, flagged episodes by reason, hung (an episode not finished within
`--hang-s`: must be 0), successful episodes lost (an unaffected episode flagged by the infrastructure or hung: must be
0), containers left behind once the servers stopped (must be 0), and the time to recover after the restart.
The faulty bundle below (`faulty_gridsim`) is what the env server serves in the local pass
(`env._target_=benchmarks.studies.soak.faulty_gridsim`, its schedule in $AGENTRL_SOAK_FAULTS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.envs.task import Bundle, Episode, TaskInfo, ToolResult, Turn, WrappedEpisode
from agentrl.testing.processes import wait_healthy

REPO = Path(__file__).resolve().parents[2]
FAULTS_VAR = "AGENTRL_SOAK_FAULTS"

# What each scheduled fault must be flagged as.
EXPECTED = {"raise_deploy": "deploy", "raise_call": "env_error", "slow_call": "tool_timeout"}
# Flags that say the model played badly, not that the infrastructure failed: never counted as a loss.
MODEL_FLAGS = {"truncated", "over_budget", "max_turns"}
# Flags a killed container can cause for the episode inside it.
CONTAINER_FLAGS = {"sandbox_error", "env_error", "env_gone", "deploy", "no_reward"}


# -- the faulty bundle, served by the env server in the local pass ----------------------------------------------


class FaultyEpisode(WrappedEpisode):
    """A GridSim episode whose first tool call or turn end raises (`raise_call`) or sleeps (`slow_call`)."""

    def __init__(self, inner: Episode, fault: str | None, slow_s: float) -> None:
        super().__init__(inner)
        self.fault, self.slow_s = fault, slow_s

    def _strike(self) -> None:
        fault, self.fault = self.fault, None  # once: the next call is the episode's own
        if fault == "raise_call":
            raise RuntimeError(f"soak: injected fault in {self.info.task_id}")
        if fault == "slow_call":
            time.sleep(self.slow_s)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self._strike()
        return self.inner.call_tool(name, arguments)

    def end_turn(self, response: str) -> Turn | None:
        self._strike()
        return self.inner.end_turn(response)


class FaultyBundle(Bundle):
    """`inner` with faults on the train tasks named in `faults` (kind -> task indices)."""

    # A slow call blocks its thread: episodes must run on the sandbox's workers, never on the event loop.
    inline_episodes = False

    def __init__(self, inner: Bundle, faults: dict[str, list[int]], slow_s: float) -> None:
        self.inner, self.slow_s = inner, slow_s
        self.name, self.version = inner.name, inner.version
        self.by_index = {int(i): kind for kind, indices in faults.items() for i in indices}

    def splits(self) -> dict[str, int]:
        return self.inner.splits()

    def task_info(self, split: str, index: int) -> TaskInfo:
        return self.inner.task_info(split, index)

    def episode(self, split: str, index: int) -> Episode:
        fault = self.by_index.get(index) if split == "train" else None
        if fault == "raise_deploy":
            raise RuntimeError(f"soak: injected fault deploying {split}/{index}")
        return FaultyEpisode(self.inner.episode(split, index), fault, self.slow_s)

    def spec(self) -> dict[str, Any]:
        return self.inner.spec()


def faulty_gridsim(**env: Any) -> Bundle:
    """The `env` group's target in the local pass: the configured bundle with the schedule in $AGENTRL_SOAK_FAULTS."""
    from agentrl.envs.bundles import load_bundle

    env.pop("_target_", None)
    plan = json.loads(os.environ.get(FAULTS_VAR) or "{}")
    return FaultyBundle(load_bundle(**env), plan.get("faults", {}), float(plan.get("slow_s", 0.0)))


# -- servers ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server run as a subprocess on a fixed port, its output in a log file; kill -9 and restart keep the port."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.port, self.log, self.env = argv, port, log, env
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> float:
        """Start and wait until healthy; returns the seconds that took."""
        t0 = time.monotonic()
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(self.env or {})})
        wait_healthy(self.proc, self.url, timeout, log=self.log, poll=0.05)
        return time.monotonic() - t0

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the server tears its episodes down), SIGKILL after `timeout`; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def env_server(sandbox: str, port: int, args: argparse.Namespace, log: Path, faults: dict[str, Any] | None) -> Server:
    argv = [sys.executable, "-m", "agentrl.envs.serve", "env=gridsim", "env.prompt_style=compact",
            f"sandbox={sandbox}", f"port={port}", f"tool_timeout={args.tool_timeout}",
            f"max_concurrent_envs={args.concurrency + 8}", "log_level=warning"]
    env = {"OMP_NUM_THREADS": "1"}
    if faults is not None:
        argv.append("env._target_=benchmarks.studies.soak.faulty_gridsim")
        env[FAULTS_VAR] = json.dumps(faults)
    return Server(argv, port, log, env)


def model_server(args: argparse.Namespace, port: int, log: Path) -> Server:
    model = ["model=tiny"] if args.model == "tiny" else ["model=hf", f"model.path={Path(args.model).resolve()}"]
    argv = [sys.executable, "-m", "agentrl.inference.serve", *model, *args.model_override, f"port={port}",
            "log_level=warning", f"default_max_tokens={args.max_response_tokens}"]
    return Server(argv, port, log, {"OMP_NUM_THREADS": str(args.model_threads), "TOKENIZERS_PARALLELISM": "false"})


def scripted_model(delay: float) -> tuple[str, Any]:
    """A scripted chat server (no model) that submits each day's optimal schedule, after one malformed call on
    every third session, each reply `delay` seconds late (so faults land on live episodes, as with a model);
    returns (URL, (the ScriptedChat, its stop function)). Only for quick runs of the soak's own logic."""
    from agentrl.envs.bundles import load_bundle
    from agentrl.testing import Reply, ScriptedChat, tool_call
    from agentrl.uvicorn_servers import start_server_in_thread

    grid = load_bundle("gridsim", prompt_style="compact")

    def reply(body: dict[str, Any], session: str | None) -> Reply:
        day = int(chat.sessions.get(session or "", {}).get("index") or 0)
        first = not any(m.get("role") == "assistant" for m in body["messages"])
        if first and day % 3 == 0:  # a malformed call: the agent answers it and the model tries again
            return Reply(tool_calls=[tool_call("submit_schedule", '{"schedule": [0, 1')], delay=delay)
        schedule = grid.row("train", day)["optimal_schedule"]
        return Reply(tool_calls=[tool_call("submit_schedule", {"schedule": schedule})], delay=delay)

    chat = ScriptedChat(reply)
    url, stop = start_server_in_thread(chat.app)
    return url, (chat, stop)


# -- one pass -----------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One episode: when it ran, its scheduled fault, and how it ended."""

    i: int
    fault: str | None = None
    started: float = 0.0
    ended: float = 0.0
    failure: str | None = None
    error: str = ""
    reward: float | None = None
    hung: bool = False


@dataclass
class PassReport:
    """A pass's figures (see the module docstring)."""

    sandbox: str
    episodes: int
    wall_s: float = 0.0
    scored: int = 0
    flagged: Counter = field(default_factory=Counter)
    hung: int = 0
    lost: list[str] = field(default_factory=list)
    faults: dict[str, str] = field(default_factory=dict)  # kind -> "fired as expected / scheduled"
    fault_other: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> how the others ended
    kill_affected: int = 0
    waited_through_restart: int = 0  # started while the server was down, and scored
    restart_healthy_s: float | None = None
    recover_s: float | None = None  # kill -> end of the first scored episode started after the kill
    container_kills: int = 0
    container_flagged: int = 0
    left_behind: int = 0
    mean_reward: float = 0.0
    load: str = ""
    outcomes: list[dict[str, Any]] = field(default_factory=list)  # per episode, for --json (times from the start)


def fault_plan(episodes: int, every: int) -> dict[str, list[int]]:
    """Which train days get which code fault: one of each kind in every block of `every` episodes."""
    if every <= 0:
        return {}
    kinds = list(EXPECTED)
    return {kind: [i for i in range(episodes) if i % every == 1 + 2 * k] for k, kind in enumerate(kinds)}


def containers(port: int, running_only: bool = False) -> list[str]:
    """Names of containers made by env servers on `port` (this soak's), running only or all."""
    argv = ["docker", "ps", "--format", "{{.Names}}", "--filter", f"name=agentrl-gridsim-{port}-"]
    if not running_only:
        argv.insert(2, "-a")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return [n for n in out.stdout.split() if n.startswith(f"agentrl-gridsim-{port}-")]


async def play_all(args: argparse.Namespace, rep: PassReport, model_url: str, server: Server,
                   plan: dict[str, list[int]], chat: Any) -> list[Outcome]:
    """Play the pass's episodes, injecting the server kill and (docker) the container kills on schedule."""
    import httpx

    from agentrl.agents.episode import play_episode
    from agentrl.config.agent import ToolCallingAgentConfig

    n, train = rep.episodes, 2000
    by_index = {i: kind for kind, idx in plan.items() for i in idx}
    outcomes = [Outcome(i, fault=by_index.get(i % train)) for i in range(n)]
    settings = ToolCallingAgentConfig(max_turns=args.max_turns, max_response_tokens=args.max_response_tokens,
                                      max_context_tokens=4096, model_timeout=args.model_timeout)
    request_kwargs = {"temperature": args.temperature, "chat_template_kwargs": {"enable_thinking": False}}
    sem = asyncio.Semaphore(args.concurrency)
    done = 0
    progress = asyncio.Event()
    limits = httpx.Limits(max_connections=args.concurrency * 2 + 8, max_keepalive_connections=args.concurrency + 8)
    client = httpx.AsyncClient(timeout=httpx.Timeout(args.model_timeout, connect=30.0), limits=limits,
                               trust_env=False)

    async def one(o: Outcome) -> None:
        nonlocal done
        async with sem:
            o.started = time.monotonic()
            meta = {"split": "train", "index": o.i % train, "url": server.url, "tool_timeout": args.tool_timeout,
                    "reset_timeout": args.reset_timeout, "connect_timeout": args.connect_timeout}
            session = ""
            try:
                r = await client.post(f"{model_url}/sessions")
                r.raise_for_status()
                session = r.json()["session_id"]
                if chat is not None:  # the scripted chat answers with this day's schedule
                    chat.sessions[session]["index"] = o.i % train
                record = await asyncio.wait_for(
                    play_episode(f"{model_url}/sessions/{session}", None, request_kwargs, meta, settings,
                                 http_client=client), args.hang_s)
                o.failure = record.failure.value if record.failure is not None else None
                o.error, o.reward = record.error or "", record.env_reward
            except TimeoutError:
                o.hung, o.failure, o.error = True, "hung", f"not finished in {args.hang_s:g} s"
            except Exception as exc:  # the soak's own plumbing (the session server refused): say so, count it
                o.failure, o.error = "soak_error", f"{type(exc).__name__}: {exc}"
            finally:
                o.ended = time.monotonic()
                if session:
                    try:
                        await client.delete(f"{model_url}/sessions/{session}")
                    except httpx.HTTPError:
                        pass
                done += 1
                progress.set()

    async def until(count: int) -> None:
        while done < count:
            progress.clear()
            await progress.wait()

    kills: list[float] = []

    async def kill_server() -> None:
        await until(int(n * args.kill_at))
        kills.append(time.monotonic())
        server.kill()
        print(f"  [{rep.sandbox}] env server killed (SIGKILL) after {done} episodes", file=sys.stderr, flush=True)
        await asyncio.sleep(args.down_s)
        t0 = time.monotonic()
        await asyncio.to_thread(server.start)
        rep.restart_healthy_s = time.monotonic() - kills[0]
        print(f"  [{rep.sandbox}] restarted in {time.monotonic() - t0:.1f} s; healthy {rep.restart_healthy_s:.1f} s "
              "after the kill", file=sys.stderr, flush=True)

    container_kills: list[tuple[float, str]] = []

    async def kill_containers() -> None:
        rng = random.Random(0)
        marks = [int(n * (j + 1) / (args.container_kills + 1)) for j in range(args.container_kills)]
        for mark in marks:
            await until(mark)
            for _ in range(50):  # wait for a live container (a fresh server may not have one yet)
                live = await asyncio.to_thread(containers, server.port, True)
                if live:
                    name = rng.choice(live)
                    container_kills.append((time.monotonic(), name))
                    await asyncio.to_thread(subprocess.run, ["docker", "kill", name], capture_output=True, timeout=60)
                    break
                await asyncio.sleep(0.1)

    t0 = time.monotonic()
    injectors = []
    if args.kill_at > 0:
        injectors.append(asyncio.create_task(kill_server()))
    if rep.sandbox == "docker" and args.container_kills:
        injectors.append(asyncio.create_task(kill_containers()))
    await asyncio.gather(*(one(o) for o in outcomes))
    rep.wall_s = time.monotonic() - t0
    for task in injectors:  # a schedule that could not be met (a tiny run) must not hold the pass
        task.cancel()
    await asyncio.gather(*injectors, return_exceptions=True)
    await client.aclose()
    rep.container_kills = len(container_kills)
    _account(rep, outcomes, kills, [t for t, _ in container_kills], plan, t0)
    return outcomes


def _account(rep: PassReport, outcomes: list[Outcome], kills: list[float], container_kills: list[float],
             plan: dict[str, list[int]], t0: float) -> None:
    """Fill the report from the outcomes: what scored, what was flagged and why, what was lost."""
    rep.scored = sum(o.failure is None for o in outcomes)
    rep.flagged = Counter(o.failure for o in outcomes if o.failure is not None)
    rep.hung = sum(o.hung for o in outcomes)
    rewards = [o.reward or 0.0 for o in outcomes if o.failure is None]
    rep.mean_reward = sum(rewards) / max(1, len(rewards))
    fired = Counter(o.fault for o in outcomes if o.fault and o.failure == EXPECTED[o.fault])
    scheduled = Counter(o.fault for o in outcomes if o.fault)
    rep.faults = {kind: f"{fired[kind]}/{scheduled[kind]}" for kind in plan if scheduled[kind]}
    for o in outcomes:
        if o.fault and o.failure != EXPECTED[o.fault]:  # e.g. live at the kill, or no call reached the env
            other = rep.fault_other.setdefault(o.fault, {})
            other[str(o.failure)] = other.get(str(o.failure), 0) + 1
    rep.outcomes = [{"i": o.i, "fault": o.fault, "started": round(o.started - t0, 3), "ended": round(o.ended - t0, 3),
                     "failure": o.failure, "error": o.error[:300], "reward": o.reward} for o in outcomes]
    kill = kills[0] if kills else None
    excusable = len(container_kills)  # a killed container flags at most the one episode inside it
    for o in sorted(outcomes, key=lambda o: o.ended):
        by_kill = kill is not None and o.started <= kill <= o.ended
        by_container = (excusable > 0 and not o.fault and not by_kill and o.failure in CONTAINER_FLAGS
                        and any(o.started <= t <= o.ended for t in container_kills))
        excusable -= by_container
        rep.kill_affected += by_kill
        rep.container_flagged += by_container
        if o.fault or by_kill or by_container:
            continue
        if o.hung or (o.failure is not None and o.failure not in MODEL_FLAGS):
            rep.lost.append(f"episode {o.i}: {o.failure}: {o.error[:200]}")
    if kill is not None:
        after = [o for o in outcomes if o.started > kill and o.failure is None]
        rep.recover_s = min(o.ended for o in after) - kill if after else None
        healthy = kill + (rep.restart_healthy_s or 0.0)
        rep.waited_through_restart = sum(o.started < healthy for o in after)


def run_pass(sandbox: str, args: argparse.Namespace, model_url: str, chat: Any, logs: Path) -> PassReport:
    """One pass on a fresh env server: play, stop the server, count what it left behind."""
    rep = PassReport(sandbox, args.episodes if sandbox == "local" else args.docker_episodes)
    plan = fault_plan(rep.episodes, args.fault_every) if sandbox == "local" else {}
    port = free_port()
    server = env_server(sandbox, port, args, logs / f"env-{sandbox}.log",
                        {"faults": plan, "slow_s": args.tool_timeout + 2.0} if plan else None)
    print(f"[{sandbox}] env server on {server.url}: {rep.episodes} episodes at {args.concurrency} concurrency",
          file=sys.stderr, flush=True)
    server.start()
    try:
        asyncio.run(play_all(args, rep, model_url, server, plan, chat))
    finally:
        server.stop()
    if sandbox == "docker":
        time.sleep(1.0)  # `docker rm` of the last episodes may still be landing
        rep.left_behind = len(containers(port))
    rep.load = "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    return rep


# -- report -------------------------------------------------------------------------------------------------------


def table(reports: list[PassReport]) -> str:
    """The summary table, one column per pass."""

    def fmt(value: Any) -> str:
        return "-" if value is None else (f"{value:.1f} s" if isinstance(value, float) else str(value))

    rows: list[tuple[str, list[Any]]] = [
        ("episodes", [r.episodes for r in reports]),
        ("wall time", [r.wall_s for r in reports]),
        ("scored (mean reward)", [f"{r.scored} ({r.mean_reward:.3f})" for r in reports]),
        ("flagged", [sum(r.flagged.values()) for r in reports]),
    ]
    reasons = sorted({k for r in reports for k in r.flagged})
    rows += [(f"  flagged {k}", [r.flagged.get(k, 0) for r in reports]) for k in reasons]
    kinds = sorted({k for r in reports for k in r.faults})
    rows += [(f"fault {k} -> {EXPECTED[k]} (fired/scheduled)", [r.faults.get(k, "-") for r in reports]) for k in kinds]
    rows += [
        ("episodes live at the SIGKILL", [r.kill_affected for r in reports]),
        ("restart: kill -> healthy", [r.restart_healthy_s for r in reports]),
        ("recover: kill -> first new episode scored", [r.recover_s for r in reports]),
        ("started while down, then scored", [r.waited_through_restart for r in reports]),
        ("containers killed / their episodes flagged", [f"{r.container_kills} / {r.container_flagged}"
                                                          if r.sandbox == "docker" else "-" for r in reports]),
        ("HUNG (must be 0)", [r.hung for r in reports]),
        ("SUCCESSFUL EPISODES LOST (must be 0)", [len(r.lost) for r in reports]),
        ("CONTAINERS LEFT BEHIND (must be 0)", [r.left_behind if r.sandbox == "docker" else "-" for r in reports]),
        ("load after the pass", [r.load.removeprefix("load average ") for r in reports]),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':<{width}} | " + " | ".join(f"{r.sandbox:>16}" for r in reports)]
    lines += [f"{name:<{width}} | " + " | ".join(f"{fmt(v):>16}" for v in values) for name, values in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1000, help="episodes of the local pass")
    ap.add_argument("--docker-episodes", type=int, default=None, help="episodes of the docker pass (default: --episodes)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--sandboxes", default="local,docker", help="passes to run, in order")
    ap.add_argument("--model", default="tiny",
                    help="tiny (made locally), a Hugging Face folder (e.g. an SFT checkpoint), or scripted")
    ap.add_argument("--scripted-delay", type=float, default=0.5, help="seconds each scripted reply waits")
    ap.add_argument("--model-override", action="append", default=[], help="extra Hydra override of the model server")
    ap.add_argument("--model-threads", type=int, default=1, help="torch threads of the session server")
    ap.add_argument("--fault-every", type=int, default=50, help="one episode of each code fault per this many")
    ap.add_argument("--kill-at", type=float, default=0.5, help="SIGKILL the env server once this share is done (0: never)")
    ap.add_argument("--down-s", type=float, default=2.0, help="seconds the killed server stays down")
    ap.add_argument("--container-kills", type=int, default=16, help="containers killed in the docker pass")
    ap.add_argument("--tool-timeout", type=float, default=3.0)
    ap.add_argument("--reset-timeout", type=float, default=120.0)
    ap.add_argument("--connect-timeout", type=float, default=60.0)
    ap.add_argument("--model-timeout", type=float, default=300.0)
    ap.add_argument("--hang-s", type=float, default=900.0, help="an episode still running after this is hung")
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-response-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--logs", default=None, help="folder for the servers' logs (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    # Dependency fault phases (benchmarks/studies/soak_dependency.py): a training run whose env server or engine dies.
    ap.add_argument("--phases", default="", help="dependency fault phases to run after the passes, comma-separated "
                    "(grpo-env-killed, trl-env-frozen-wait, ...; all: every one); --sandboxes '' runs only these")
    ap.add_argument("--grace-s", type=float, default=20.0, help="trainer.dependency_grace_s of the phases' runs")
    ap.add_argument("--phase-steps", type=int, default=3, help="steps of a -wait phase's run (it must finish)")
    ap.add_argument("--phase-port", type=int, default=8700, help="the first phase's env server port (one each)")
    # The "dockerd frozen" phase (benchmarks/studies/soak_dockerd.py): a reset under a Docker daemon that answers nothing.
    ap.add_argument("--dockerd-frozen", action="store_true", help="run the dockerd-frozen phase after the passes")
    ap.add_argument("--dockerd-resets", type=int, default=8, help="resets the dockerd-frozen phase starts at once")
    ap.add_argument("--dockerd-timeout", type=float, default=None, help="its sandbox.docker_timeout (default: config's)")
    args = ap.parse_args(argv)
    if args.docker_episodes is None:
        args.docker_episodes = args.episodes
    return args


def soak(args: argparse.Namespace) -> list[PassReport]:
    """Run every pass of `args` and return their reports."""
    import tempfile

    logs = Path(args.logs or tempfile.mkdtemp(prefix="agentrl-soak-"))
    logs.mkdir(parents=True, exist_ok=True)
    model: Server | None = None
    chat = stop_chat = None
    if args.model == "scripted":
        model_url, (chat, stop_chat) = scripted_model(args.scripted_delay)
    else:
        model = model_server(args, free_port(), logs / "model.log")
        model.start(timeout=600)
        model_url = model.url
    reports = []
    try:
        for sandbox in [s for s in args.sandboxes.split(",") if s]:
            reports.append(run_pass(sandbox, args, model_url, chat, logs))
    finally:
        if model is not None:
            model.stop()
        if stop_chat is not None:
            stop_chat()
    print(f"logs in {logs}", file=sys.stderr)
    return reports


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    reports = soak(args) if args.sandboxes.strip(",") else []
    print(f"fault soak: model {args.model}, {args.concurrency} concurrent, {os.cpu_count()} CPUs, {started} at the start")
    if reports:
        print(table(reports))
    phases = dependency_phases(args)
    frozen = dockerd_frozen_phase(args)
    for r in reports:
        for kind, other in r.fault_other.items():
            print(f"[{r.sandbox}] {kind} not flagged {EXPECTED[kind]}: {other}")
        for line in r.lost[:20]:
            print(f"LOST [{r.sandbox}] {line}")
    if args.json:
        Path(args.json).write_text(json.dumps([{**r.__dict__, "flagged": dict(r.flagged)} for r in reports]
                                              + [p.__dict__ for p in phases], indent=2))
    bad = any(r.hung or r.lost or r.left_behind for r in reports)
    return 1 if bad or any(map(phase_failed, phases)) or (frozen is not None and not frozen.ok) else 0


def dockerd_frozen_phase(args: argparse.Namespace) -> Any:
    """With `--dockerd-frozen`: run that phase (benchmarks/studies/soak_dockerd.py), print its figures, return its report."""
    if not args.dockerd_frozen:
        return None
    import tempfile

    from soak_dockerd import dockerd_frozen, table  # beside this script (sys.path[0])

    logs = Path(args.logs or tempfile.mkdtemp(prefix="agentrl-soak-dockerd-"))
    logs.mkdir(parents=True, exist_ok=True)
    report = dockerd_frozen(args.dockerd_resets, args.dockerd_timeout, logs)
    print("dockerd frozen:")
    print(table(report))
    return report


def dependency_phases(args: argparse.Namespace) -> list[Any]:
    """Run `--phases` (benchmarks/studies/soak_dependency.py) and print their table."""
    import tempfile

    from soak_dependency import PHASES, phase_table, run_phases  # beside this script (sys.path[0])

    names = list(PHASES) if args.phases == "all" else [n for n in args.phases.split(",") if n]
    if not names:
        return []
    logs = Path(args.logs or tempfile.mkdtemp(prefix="agentrl-soak-phases-"))
    logs.mkdir(parents=True, exist_ok=True)
    phases = run_phases(names, args, logs)
    print(phase_table(phases, args.grace_s))
    print(f"phase logs in {logs}", file=sys.stderr)
    return phases


def phase_failed(report: Any) -> bool:
    from soak_dependency import bad

    return bad(report)


if __name__ == "__main__":
    sys.exit(main())
