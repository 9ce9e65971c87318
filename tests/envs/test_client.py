"""EpisodeClient against the real env server (echo test bundle) on loopback uvicorn."""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.asyncio.server import serve as ws_serve
from websockets.datastructures import Headers
from websockets.http11 import Response

from agentrl.envs.client import (
    EnvAuthError,
    EnvClientError,
    EnvConnectionError,
    EnvResetError,
    EnvTimeoutError,
    EnvUnreachableError,
    EpisodeClient,
    openai_tool,
    ws_url,
)
from agentrl.envs.server import build_app, serve_in_background, start_server_in_thread
from agentrl.envs.server.echo import EchoBundle
from agentrl.testing.ports import free_port


@pytest.fixture(scope="module")
def url():
    with serve_in_background(build_app(EchoBundle(), tool_timeout=0.5)) as base:
        yield base


def test_ws_url():
    assert ws_url("http://h:1") == "ws://h:1/ws"
    assert ws_url("https://h/env/") == "wss://h/env/ws"
    assert ws_url("ws://h:2/ws") == "ws://h:2/ws"
    with pytest.raises(ValueError):
        ws_url("ftp://h")


async def test_plays_an_episode(url):
    async with EpisodeClient(url) as env:
        prompt, system, tools = await env.reset("eval", 1)
        assert prompt.endswith("answer-eval-1.") and system == "You are a test agent."
        names = [t["function"]["name"] for t in tools]
        assert names == ["echo", "sleep", "finish", "end_turn"]
        assert tools[0]["type"] == "function" and tools[0]["function"]["parameters"]["required"] == ["text"]
        r = await env.call("echo", {"text": "hi"})
        assert (r.text, r.is_error, r.done, r.reward) == ("hi", False, False, None)
        r = await env.call("nope", {})
        assert r.is_error and r.error_type == "tool_not_found" and not r.done
        r = await env.end_turn("answer-eval-1")
        assert (r.done, r.reward, r.scores, r.failure) == (True, 1.0, {"match": 1.0}, None)
        assert r.metadata["task"]["id"] == "echo-eval-1"
        # The next episode reuses the connection; a tool may end it.
        await env.reset("train", 2)
        r = await env.call("finish", {"answer": "wrong"})
        assert (r.done, r.reward, r.text) == (True, 0.0, "graded")
        state = await env.state()
        assert state["task_id"] == "echo-train-2" and state["done"] is True


async def test_bad_requests(url):
    async with EpisodeClient(url) as env:
        with pytest.raises(EnvConnectionError):
            await env.call("echo", {"text": "x"})  # never reset
        with pytest.raises(EnvResetError, match="there is no split 'dev'") as ei:
            await env.reset("dev", 0)
        assert ei.value.metadata["status"] == "error"
        with pytest.raises(EnvResetError, match="has no task 9"):
            await env.reset("eval", 9)
        await env.reset("eval", 0)
        with pytest.raises(TypeError):
            await env.call("echo", ["x"])
        r = await env.call("sleep", {"seconds": 2})  # past the server's tool_timeout
        assert r.done and r.failure == "tool_timeout" and r.error_type == "timeout" and r.reward is None


async def test_multi_turn_end_turn_carries_the_next_prompt():
    with serve_in_background(build_app(EchoBundle(turns=3))) as url:
        async with EpisodeClient(url) as env:
            await env.reset("eval", 0)
            for _ in range(2):
                r = await env.end_turn("not yet")
                assert not r.done and r.prompt.startswith("Task echo-eval-0") and r.system_prompt
                assert [t["function"]["name"] for t in r.tools][-1] == "end_turn"
            r = await env.end_turn("answer-eval-0")
            assert r.done and r.reward == 1.0 and r.prompt is None


async def test_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("ECHO_TOKEN", "tok-123")
    monkeypatch.setenv("WRONG_TOKEN", "tok-999")
    with serve_in_background(build_app(EchoBundle(), token="tok-123")) as url:
        async with EpisodeClient(url, token_var="ECHO_TOKEN") as env:
            await env.reset("eval", 0)
            assert (await env.end_turn("answer-eval-0")).reward == 1.0
        for kwargs in ({"token_var": "WRONG_TOKEN"}, {}):
            t0 = time.monotonic()
            with pytest.raises(EnvAuthError):
                async with EpisodeClient(url, reset_timeout=30, **kwargs) as env:
                    await env.reset("eval", 0)
            assert time.monotonic() - t0 < 5  # refused at once, not retried until the deadline
    with pytest.raises(EnvClientError, match="NOT_SET_ANYWHERE"):
        EpisodeClient("http://127.0.0.1:1", token_var="NOT_SET_ANYWHERE")


async def test_nothing_listening_gives_up_after_connect_timeout_not_reset_timeout():
    url = f"http://127.0.0.1:{free_port()}"
    async with asyncio.timeout(60):  # only a hang guard: with the bug it waits the whole reset_timeout
        with pytest.raises(EnvUnreachableError) as ei:
            async with EpisodeClient(url, reset_timeout=600, connect_timeout=0.5) as env:
                await env.reset("eval", 0)
    assert ei.value.url == ws_url(url) and ws_url(url) in str(ei.value)
    assert "connect_timeout 0.5s" in str(ei.value) and "refused" in str(ei.value).lower()
    # A reset_timeout shorter than connect_timeout still bounds the wait, and the cause is still named.
    with pytest.raises(EnvUnreachableError):
        async with asyncio.timeout(60), EpisodeClient(url, reset_timeout=0.3) as env:
            await env.reset("eval", 0)
    # An unknown host is unreachable too.
    with pytest.raises(EnvUnreachableError, match="no-such-host.invalid"):
        async with asyncio.timeout(60), EpisodeClient("http://no-such-host.invalid:80", connect_timeout=0.3) as env:
            await env.reset("eval", 0)


def test_bad_timeouts_are_refused():
    with pytest.raises(ValueError, match="connect 0"):
        EpisodeClient("http://127.0.0.1:1", connect_timeout=0)


async def _http_server(status: int, calls: list[int]):
    """A WebSocket server that answers every upgrade with HTTP `status` (a restarting server says 503)."""

    def refuse(connection, request):
        calls.append(status)
        return Response(status, "refused", Headers([("Content-Length", "0")]), b"")

    return ws_serve(lambda ws: ws.close(), "127.0.0.1", 0, process_request=refuse)


async def test_a_server_answering_503_is_waited_for_until_reset_timeout():
    calls: list[int] = []
    async with await _http_server(503, calls) as server:
        port = server.sockets[0].getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(EnvConnectionError) as ei:
            async with asyncio.timeout(60), EpisodeClient(f"http://127.0.0.1:{port}", reset_timeout=1.5,
                                                          connect_timeout=0.1) as env:
                await env.reset("eval", 0)
        # It answers, so it is not "unreachable": the wait is reset_timeout's, not connect_timeout's.
        assert not isinstance(ei.value, EnvUnreachableError) and "503" in str(ei.value)
        assert time.monotonic() - t0 >= 1.0 and len(calls) > 2


async def test_a_gateway_with_nothing_behind_it_counts_as_unreachable():
    calls: list[int] = []
    async with await _http_server(502, calls) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(EnvUnreachableError, match="502"):
            async with asyncio.timeout(60), EpisodeClient(f"http://127.0.0.1:{port}", reset_timeout=600,
                                                          connect_timeout=0.3) as env:
                await env.reset("eval", 0)


async def test_a_wrong_path_fails_at_once():
    calls: list[int] = []
    async with await _http_server(404, calls) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(EnvConnectionError, match="HTTP 404"):
            async with asyncio.timeout(60), EpisodeClient(f"http://127.0.0.1:{port}", reset_timeout=600) as env:
                await env.reset("eval", 0)
        assert calls == [404]


def test_openai_tool_reads_either_schema_spelling():
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    for key in ("input_schema", "inputSchema"):
        assert openai_tool({"name": "t", key: schema}) == {
            "type": "function", "function": {"name": "t", "description": "", "parameters": schema}}
    assert openai_tool({"name": "t"})["function"]["parameters"] == {"type": "object", "properties": {}}


async def test_silent_server_times_out():
    async def mute(ws) -> None:
        async for _ in ws:
            pass

    async with ws_serve(mute, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(EnvTimeoutError):
            async with EpisodeClient(f"http://127.0.0.1:{port}", reset_timeout=0.5) as env:
                await env.reset("eval", 0)


async def test_waits_for_room_on_a_full_server():
    with serve_in_background(build_app(EchoBundle(), max_concurrent_envs=1)) as url:
        holder = EpisodeClient(url)
        await holder.reset("eval", 0)
        async with EpisodeClient(url, reset_timeout=0.4) as impatient:
            with pytest.raises(EnvConnectionError, match="no room"):
                await impatient.reset("eval", 1)

        async def release() -> None:
            await asyncio.sleep(0.5)
            await holder.close()

        # A full server answers, so connect_timeout does not cut the wait short.
        async with EpisodeClient(url, reset_timeout=10, connect_timeout=0.1) as patient:
            t0 = time.monotonic()
            releaser = asyncio.create_task(release())
            prompt, _, _ = await patient.reset("eval", 1)
            assert time.monotonic() - t0 >= 0.45 and "answer-eval-1" in prompt
            await releaser
            assert (await patient.end_turn("answer-eval-1")).reward == 1.0


async def test_rides_out_a_server_restart():
    port = free_port()
    app = build_app(EchoBundle())
    _, stop = start_server_in_thread(app, port=port)
    async with EpisodeClient(f"http://127.0.0.1:{port}", reset_timeout=20) as env:
        await env.reset("eval", 0)
        assert (await env.call("echo", {"text": "before"})).text == "before"
        await asyncio.to_thread(stop)  # the server goes away mid-episode
        with pytest.raises(EnvConnectionError):
            await env.call("echo", {"text": "lost"})

        async def restart() -> None:
            await asyncio.sleep(1.0)
            _, stop2 = await asyncio.to_thread(start_server_in_thread, build_app(EchoBundle()), port=port)
            restarted.append(stop2)

        restarted: list = []
        task = asyncio.create_task(restart())
        t0 = time.monotonic()
        await env.reset("eval", 0)  # waits while the server is down, then plays on
        assert time.monotonic() - t0 >= 0.9
        await task
        assert (await env.end_turn("answer-eval-0")).reward == 1.0
    await asyncio.to_thread(restarted[0])
