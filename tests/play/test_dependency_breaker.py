"""The circuit breaker's rules (`agentrl/play/dependency_breaker.py`) against real servers: a real env server's
/health (the echo bundle on loopback uvicorn), a port where nothing listens, and one whose process never answers
(a socket that listens but never accepts). The plays are small coroutines that return rollout records or hang,
so the tests see exactly which plays were cut, kept and replayed."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest

from agentrl.agents.record import Failure, Rollout
from agentrl.envs.server import build_app
from agentrl.envs.server.echo import EchoBundle
from agentrl.play.dependency_breaker import (
    ENGINE_FAILURES,
    ENV_FAILURES,
    PROBE_EVERY_S,
    Breaker,
    Dependency,
    DependencyLost,
    play_guarded,
)
from agentrl.play.failure_notes import FailureNotes
from agentrl.testing.ports import free_port
from agentrl.uvicorn_servers import start_server_in_thread

SLACK_S = 60  # a loaded box: ticks, probes and cancellation, never a speed claim


def failed(kind: Failure, error: str = "boom") -> list[Rollout]:
    r = Rollout()
    r.flag(kind, error)
    return [r]


def clean() -> list[Rollout]:
    return [Rollout(scores={"score": 1.0}, reward=1.0)]


def breaker(env_url: str, engine_url: str, **kwargs) -> Breaker:
    return Breaker([Dependency("env server", env_url, ENV_FAILURES),
                    Dependency("engine", engine_url, ENGINE_FAILURES)], **kwargs)


@pytest.fixture(scope="module")
def live() -> str:
    url, stop = start_server_in_thread(build_app(EchoBundle()))
    yield url
    stop()


@pytest.fixture(scope="module")
def unhealthy() -> str:
    """A server whose /health says it cannot serve (503 with its reason), as a session server over a dead engine."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "unavailable", "error": "the engine's worker died"}, status_code=503)

    url, stop = start_server_in_thread(app)
    yield url
    stop()


async def test_a_streak_trips_when_health_says_unhealthy_not_when_it_is_silent(live: str, unhealthy: str) -> None:
    b = breaker(live, unhealthy, grace_s=600, max_failures=3)
    for _ in range(3):
        b.record(failed(Failure.MODEL_ERROR, "answered HTTP 503"))
    async with asyncio.timeout(SLACK_S):
        dep = await b.watch()
    assert dep.name == "engine" and "HTTP 503" in dep.health and "worker died" in dep.health
    message = str(b.lost(dep))
    assert f"the engine at {unhealthy} stopped answering" in message and "3 plays in a row failed model_error" \
        in message and "answered HTTP 503" in message
    # Nothing listens (it may be restarting) or it answers (a blip it rode out): the streak alone trips nothing;
    # the grace window judges.
    for env_url in (f"http://127.0.0.1:{free_port()}", live):
        b = breaker(env_url, live, grace_s=600, max_failures=3)
        for _ in range(3):
            b.record(failed(Failure.ENV_UNREACHABLE, "connection refused"))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2 * PROBE_EVERY_S):
                await b.watch()
        env = b.dependencies[0]
        assert env.troubled and env.streak == (3 if env_url != live else 0), env_url


async def test_a_frozen_dependency_trips_by_the_grace_window_and_a_success_clears_it(live: str) -> None:
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(64)
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        b = breaker(live, url, grace_s=3, max_failures=100)  # no play failed: only /health says it
        t0 = time.monotonic()
        async with asyncio.timeout(SLACK_S):
            dep = await b.watch()
        assert time.monotonic() - t0 >= 3
        assert dep.name == "engine" and "did not answer within" in dep.health
    assert b.dependencies[0].troubled is False  # the live env server was never in trouble
    b.record(clean())
    assert not dep.troubled and dep.trouble_s == 0


async def test_stop_cuts_the_plays_in_flight_instead_of_waiting_them_out(live: str, caplog) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    b = breaker(dead, live, grace_s=2, max_failures=100, notes=FailureNotes())
    cut: list[int] = []

    async def play(unit: int) -> list[Rollout]:
        if unit == 0:
            return failed(Failure.ENV_UNREACHABLE, "nothing listens")
        try:
            await asyncio.sleep(3600)  # a reset that would wait out its whole timeout
        except asyncio.CancelledError:
            cut.append(unit)
            raise
        return clean()

    with caplog.at_level(logging.WARNING, logger="agentrl.play"):
        async with asyncio.timeout(SLACK_S):
            with pytest.raises(DependencyLost, match=f"the env server at {dead} stopped answering") as ei:
                await play_guarded(b, list(range(8)), play)
    assert sorted(cut) == list(range(1, 8)) and ei.value.url == dead
    # The console heard of it when it happened: the new failure kind and the env server in trouble.
    text = caplog.text
    assert "first rollout flagged env_unreachable: nothing listens" in text and f"env server at {dead}" in text


async def test_wait_keeps_finished_plays_and_replays_only_what_the_outage_cut(live: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    b = breaker(url, live, grace_s=2, on_loss="wait")
    calls: dict[int, int] = {0: 0, 1: 0, 2: 0}
    back: list = []

    async def play(unit: int) -> list[Rollout]:
        calls[unit] += 1
        if unit == 0:
            return clean()  # finished before the outage: must never be played again
        if back:
            return clean()
        if unit == 1:
            await asyncio.sleep(0.5)  # after unit 0 has finished
            return failed(Failure.ENV_UNREACHABLE, "connection refused")
        await asyncio.sleep(3600)  # in flight when the breaker trips
        return clean()

    async def restart() -> None:
        while b.tripped() is None:  # until the breaker has cut the plays and waits for /health
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        back.append(await asyncio.to_thread(start_server_in_thread, build_app(EchoBundle()), port=port))

    try:
        async with asyncio.timeout(SLACK_S + PROBE_EVERY_S):
            restarter = asyncio.create_task(restart())
            done = await play_guarded(b, [0, 1, 2], play)
            await restarter
    finally:
        for _, stop in back:
            stop()
    assert calls == {0: 1, 1: 2, 2: 2}
    assert all(r.failure is None for rs in done.values() for r in rs) and sorted(done) == [0, 1, 2]


def test_failure_notes_warn_once_per_kind_and_on_a_high_share(caplog) -> None:
    notes = FailureNotes(share=0.5)
    with caplog.at_level(logging.WARNING, logger="agentrl.play"):
        notes.saw(failed(Failure.DEPLOY, "reset refused"))
        notes.saw(failed(Failure.DEPLOY, "again"))
        assert notes.step(3, [*clean(), *clean(), *failed(Failure.DEPLOY)]) is None  # a third: under the share
        line = notes.step(4, [*clean(), *failed(Failure.DEPLOY), *failed(Failure.MODEL_ERROR)])
    assert caplog.text.count("first rollout flagged deploy") == 1 and "again" not in caplog.text
    assert line is not None and "step 4: 2 of 3 rollouts flagged" in line and line in caplog.text
    with pytest.raises(ValueError, match="warn_failure_share"):
        FailureNotes(share=0)


async def test_wait_replays_a_play_that_failed_while_the_server_was_down_even_without_a_trip(live: str) -> None:
    port = free_port()
    b = breaker(f"http://127.0.0.1:{port}", live, grace_s=600, on_loss="wait")
    calls = {0: 0, 1: 0}
    back: list = []

    async def play(unit: int) -> list[Rollout]:
        calls[unit] += 1
        if unit == 1 and calls[1] == 1:  # its reset gave up on the dead server; the round ends with no trip
            return failed(Failure.ENV_UNREACHABLE, "connection refused")
        if unit == 1:  # the replay: the server is back by now
            back.append(await asyncio.to_thread(start_server_in_thread, build_app(EchoBundle()), port=port))
        return clean()

    try:
        async with asyncio.timeout(SLACK_S):
            done = await play_guarded(b, [0, 1], play)
    finally:
        for _, stop in back:
            stop()
    assert calls == {0: 1, 1: 2} and all(r.failure is None for rs in done.values() for r in rs)


async def test_wait_refuses_to_wait_for_a_dependency_whose_health_answers(live: str) -> None:
    b = breaker(live, live, grace_s=2, on_loss="wait")

    async def play(unit: int) -> list[Rollout]:
        if unit == 0:
            return failed(Failure.DEPLOY, "the sandbox never started")
        await asyncio.sleep(3600)
        return clean()

    async with asyncio.timeout(SLACK_S):
        with pytest.raises(DependencyLost, match="its /health answers, so waiting for it cannot help"):
            await play_guarded(b, [0, 1], play)


async def test_wait_replays_when_the_server_is_back_by_the_time_the_breaker_trips(live: str) -> None:
    port = free_port()
    b = breaker(f"http://127.0.0.1:{port}", live, grace_s=3, on_loss="wait")
    calls = {0: 0}
    back: list = []

    async def play(unit: int) -> list[Rollout]:
        calls[unit] += 1
        if calls[unit] > 1:
            return clean()
        while not b.dependencies[0].went_down:  # a probe found it down ...
            await asyncio.sleep(0.1)
        # ... then it comes back before the grace window ends, while this play still hangs on it.
        back.append(await asyncio.to_thread(start_server_in_thread, build_app(EchoBundle()), port=port))
        await asyncio.sleep(3600)
        return clean()

    try:
        async with asyncio.timeout(SLACK_S):
            done = await play_guarded(b, [0], play)
    finally:
        for _, stop in back:
            stop()
    assert calls == {0: 2} and done[0][0].failure is None


async def _closes_each_kept_alive_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer a connection's first request 200 (keep-alive), then drop it when the next request arrives: the
    race a pooled client meets when the server closes an idle connection just as the client reuses it."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
                 b"Connection: keep-alive\r\n\r\n{\"status\":\"ok\"}")
    await writer.drain()
    try:
        await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


async def test_a_kept_alive_connection_closed_under_the_probe_is_not_trouble() -> None:
    server = await asyncio.start_server(_closes_each_kept_alive_connection, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    dep = Dependency("env server", url, ENV_FAILURES)
    b = Breaker([dep])
    from agentrl.http import async_client

    try:
        async with async_client() as client:
            assert await b.probe(client, dep)
            # the pooled connection is dropped under this probe: one fresh ask answers, so no trouble is recorded
            assert await b.probe(client, dep), dep.health
            assert not dep.troubled and not dep.went_down
    finally:
        server.close()
        await server.wait_closed()
