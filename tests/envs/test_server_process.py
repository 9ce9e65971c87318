"""The env server as its own process: SIGTERM with live episodes, the Hydra `serve` entry point, and the run's
env server in a child (`env.server.process=true`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.client import EnvConnectionError, EpisodeClient
from agentrl.envs.server.echo import EchoBundle
from agentrl.envs.server.process import EnvServerError, EnvServerProcess
from agentrl.plan import PlanError, build_plan
from agentrl.testing.config import compose_config
from agentrl.testing.ports import free_port
from agentrl.testing.processes import wait_healthy

REPO = Path(__file__).resolve().parents[2]

ECHO_SERVER = """
import sys
from agentrl.envs.serve import run_server
from agentrl.envs.server import build_app
from agentrl.envs.server.echo import EchoBundle
run_server(build_app(EchoBundle(marker_dir=sys.argv[1])), "127.0.0.1", int(sys.argv[2]), log_level="warning")
"""

ECHO_LOADER = """
def load(bundle, **options):
    from agentrl.envs.server.echo import EchoBundle
    return EchoBundle(**options)
"""


def test_sigterm_tears_live_episodes_down(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(tmp_path), str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)

        async def live_episodes() -> list[EpisodeClient]:
            clients = [EpisodeClient(url) for _ in range(3)]
            for i, c in enumerate(clients):
                await c.reset("train", i)
            return clients

        async def scenario() -> None:
            clients = await live_episodes()
            assert not list(tmp_path.glob("closed-*"))
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
            assert time.monotonic() - t0 < 25
            with pytest.raises(EnvConnectionError):  # the episode went with the server
                await clients[0].call("echo", {"text": "x"})
            for c in clients:
                await c.close()

        asyncio.run(scenario())
        # uvicorn re-raises the signal once its shutdown is done, so the exit says "terminated".
        assert proc.returncode in (0, -signal.SIGTERM), proc.communicate()[1][-3000:]
        closed = sorted(p.name.split("-")[1:4] for p in tmp_path.glob("closed-*"))
        assert closed == [["echo", "train", "0"], ["echo", "train", "1"], ["echo", "train", "2"]]
        assert all(f"-{proc.pid}-" in p.name for p in tmp_path.glob("closed-*"))
        with pytest.raises(ProcessLookupError):  # nothing left behind
            os.kill(proc.pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_hydra_entry_serves_gridsim_behind_a_token(tmp_path):
    port = free_port()
    env = {**os.environ, "GRID_TOKEN": "grid-secret", "AGENTRL_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "agentrl.envs.serve", "env=gridsim", f"port={port}", "token_var=GRID_TOKEN",
           "max_concurrent_envs=2", "log_level=warning"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        assert httpx.get(f"{url}/metadata").status_code == 401
        meta = httpx.get(f"{url}/metadata", headers={"Authorization": "Bearer grid-secret"}).json()
        assert meta["name"] == "gridsim"
        schedule = load_bundle("gridsim").row("eval", 3)["optimal_schedule"]

        async def play() -> float | None:
            os.environ["GRID_TOKEN"] = "grid-secret"
            try:
                async with EpisodeClient(url, token_var="GRID_TOKEN") as client:
                    _, _, tools = await client.reset("eval", 3)
                    assert [t["function"]["name"] for t in tools] == ["submit_schedule", "end_turn"]
                    return (await client.call("submit_schedule", {"schedule": schedule})).reward
            finally:
                del os.environ["GRID_TOKEN"]

        assert asyncio.run(play()) == 1.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) in (0, -signal.SIGTERM)
        assert not list(tmp_path.iterdir())  # a server writes no run folder
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_hydra_entry_refuses_an_unset_token_var(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_TOKEN_VAR"}
    out = subprocess.run([sys.executable, "-m", "agentrl.envs.serve", "token_var=NO_SUCH_TOKEN_VAR",
                          f"port={free_port()}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "NO_SUCH_TOKEN_VAR" in out.stderr + out.stdout


def test_env_server_process_serves_from_the_spec_and_tears_its_episodes_down(tmp_path):
    """`env.server.process=true`'s child: the bundle rebuilt from its spec, served from another pid; stop() ends
    the live episodes (their close runs in the child) and leaves nothing listening."""
    (tmp_path / "echo_loader.py").write_text(ECHO_LOADER)
    markers = tmp_path / "markers"
    markers.mkdir()
    spec = EchoBundle(marker_dir=str(markers)).spec()
    child = EnvServerProcess(spec, app_options={"max_concurrent_envs": 4}, loader=f"{tmp_path}/echo_loader.py:load")
    try:
        assert child.pid != os.getpid()

        async def live_episodes() -> list[EpisodeClient]:
            clients = [EpisodeClient(child.base_url) for _ in range(2)]
            for i, c in enumerate(clients):
                await c.reset("train", i)
            result = await clients[0].call("echo", {"text": "hi"})
            assert "hi" in result.text and not result.is_error
            return clients

        clients = asyncio.run(live_episodes())
        assert not list(markers.glob("closed-*"))
    finally:
        child.stop()
    closed = sorted(p.name.split("-")[1:4] for p in markers.glob("closed-*"))
    assert closed == [["echo", "train", "0"], ["echo", "train", "1"]]
    assert all(f"-{child.pid}-" in p.name for p in markers.glob("closed-*"))  # closed in the child, not here
    assert not child._proc.is_alive()  # noqa: SLF001
    with pytest.raises(httpx.ConnectError):
        httpx.get(child.base_url + "/health", timeout=5)
    for c in clients:
        asyncio.run(c.close())


def test_env_server_process_names_a_bundle_it_cannot_load():
    with pytest.raises(EnvServerError, match="could not serve no-such-bundle"):
        EnvServerProcess({"bundle": "no-such-bundle"})


def test_a_killed_env_server_process_refuses_connections():
    child = EnvServerProcess(load_bundle("gridsim").spec())
    try:
        assert httpx.get(child.base_url + "/health", timeout=30).status_code == 200
        os.kill(child.pid, signal.SIGKILL)
        child._proc.join(30)  # noqa: SLF001
        with pytest.raises(httpx.ConnectError):  # what the trainer's dependency watch names as the env server
            httpx.get(child.base_url + "/health", timeout=5)
    finally:
        child.stop(timeout=5)


@pytest.mark.parametrize(("overrides", "message"), [
    (["+recipe=gridsim_grpo", "env.server.url=http://127.0.0.1:9"], "names one already running: set one of them"),
    (["+recipe=gridsim_miles"], "env.server.process=true is not applied under trainer=miles"),
])
def test_env_server_process_is_refused_at_plan_time_where_it_cannot_apply(tmp_path, overrides, message):
    cfg = compose_config(*overrides, "env.server.process=true", f"paths.output_root={tmp_path / 'out'}")
    with pytest.raises(PlanError, match=message):
        build_plan(cfg, choices={}, run_dir=tmp_path / "run")
