"""The env server with the Docker sandbox against a real daemon: a server killed with -9 and restarted on the same
port reaps its predecessor's containers, and a daemon that stops answering is named in resets and `/health`.

Needs a Docker daemon (`bash .ci/setup_docker.sh`); skipped with a reason when none answers, unless
AGENTRL_REQUIRE_DOCKER=1 (then that fails).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.client import EnvResetError, EpisodeClient
from agentrl.envs.server import build_app, serve_in_background
from agentrl.testing.processes import wait_healthy

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gridsim():
    return load_bundle("gridsim")


async def play(url: str, gridsim, index: int) -> float | None:
    async with EpisodeClient(url, reset_timeout=120) as env:
        await env.reset("eval", index)
        schedule = gridsim.row("eval", index)["optimal_schedule"]
        return (await env.call("submit_schedule", {"schedule": schedule})).reward


def owned_by(client, pid: int) -> list:
    return client.containers.list(all=True, filters={"label": f"agentrl.pid={pid}"}, ignore_removed=True)


def socket_dirs_of(pid: int) -> list[Path]:
    found = []
    for owner in Path(tempfile.gettempdir()).glob("agentrl-sbx-*/owner.json"):
        try:
            if json.loads(owner.read_text()).get("agentrl.pid") == str(pid):
                found.append(owner.parent)
        except (OSError, ValueError):
            pass
    return found


def start_server(port: int, home: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "agentrl.envs.serve", "env=gridsim", "sandbox=docker", f"port={port}",
           "log_level=warning"]
    env = {**os.environ, "AGENTRL_HOME": str(home)}
    proc = subprocess.Popen(cmd, cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_healthy(proc, f"http://127.0.0.1:{port}", timeout=120)
    return proc


def test_a_server_restarted_on_the_same_port_reaps_what_its_killed_predecessor_left(docker_client, gridsim,
                                                                                     tmp_path):
    port, url = free_port(), None
    url = f"http://127.0.0.1:{port}"
    first = start_server(port, tmp_path)
    second = None
    try:
        async def hold_live_episodes() -> list[EpisodeClient]:
            clients = [EpisodeClient(url, reset_timeout=120) for _ in range(3)]
            for i, c in enumerate(clients):
                await c.reset("eval", i)
            return clients

        clients = asyncio.run(hold_live_episodes())
        orphans = {c.id for c in owned_by(docker_client, first.pid)}
        assert len(orphans) == 3 and socket_dirs_of(first.pid)
        first.kill()  # SIGKILL: no shutdown, no atexit
        first.wait(30)
        # The containers outlive their server (their agents exit when the socket closes; nobody removes them).
        assert {c.id for c in owned_by(docker_client, first.pid)} == orphans

        second = start_server(port, tmp_path)  # same port, hence the same readable sandbox name
        assert owned_by(docker_client, first.pid) == [] and socket_dirs_of(first.pid) == []
        assert httpx.get(f"{url}/health", trust_env=False).json()["sandbox"]["status"] == "healthy"

        async def play_on() -> list[float | None]:
            for c in clients:  # the old sessions died with the old server
                await c.close()
            return await asyncio.gather(*(play(url, gridsim, i) for i in range(5)))

        assert asyncio.run(play_on()) == [1.0] * 5  # more episodes than orphans: no container name conflicts
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) in (0, -signal.SIGTERM)
        assert owned_by(docker_client, second.pid) == [] and socket_dirs_of(second.pid) == []
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for proc in (first, second):
            if proc is not None:
                for c in owned_by(docker_client, proc.pid):
                    c.remove(force=True)


class DaemonRelay:
    """A unix socket that relays to the Docker daemon's, and can stop and start again: to the sandbox, exactly a
    daemon that goes away and comes back (the real daemon keeps running for everyone else)."""

    def __init__(self, path: Path, target: str) -> None:
        self.path, self.target = path, target
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _do(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_unix_server(self._relay, path=str(self.path))

        self._do(start())

    def stop(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in self._writers:
                w.close()
            self._writers.clear()
            self.path.unlink(missing_ok=True)

        self._do(stop())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_a_daemon_that_stops_answering_is_named_in_resets_and_health(docker_client, gridsim, monkeypatch):
    target = (os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock").removeprefix("unix://")
    folder = Path(tempfile.mkdtemp(prefix="relay-"))
    relay = DaemonRelay(folder / "docker.sock", target)
    relay.start()
    address = f"unix://{relay.path}"
    monkeypatch.setenv("DOCKER_HOST", address)
    app = build_app(gridsim, sandbox="docker", max_concurrent_envs=4)
    sandbox = app.state.served.sandbox
    try:
        with serve_in_background(app) as url:

            def health() -> tuple[int, dict]:
                r = httpx.get(f"{url}/health", trust_env=False, timeout=30)
                return r.status_code, r.json()

            def wait_health(status: int) -> dict:
                deadline = time.monotonic() + 30  # a cached report lives a second
                while (got := health())[0] != status and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert got[0] == status, got
                return got[1]

            body = wait_health(200)
            assert body["status"] == "healthy" and body["sandbox"]["daemon"] == address
            assert asyncio.run(play(url, gridsim, 0)) == 1.0

            relay.stop()  # the daemon goes away
            with pytest.raises(EnvResetError) as ei:
                asyncio.run(play(url, gridsim, 1))
            assert f"the Docker daemon does not answer at {address}" in str(ei.value)
            assert ei.value.metadata["failure"] == "reset_failed"
            body = wait_health(503)
            assert body["status"] == "unhealthy" and body["sandbox"]["status"] == "unhealthy"
            assert f"the Docker daemon does not answer at {address}" in body["sandbox"]["error"]

            relay.start()  # and comes back: the same server deploys again
            wait_health(200)
            assert asyncio.run(play(url, gridsim, 2)) == 1.0
        left = docker_client.containers.list(all=True, filters={"label": f"agentrl.instance={sandbox.instance_id}"})
        assert left == []
    finally:
        relay.close()
