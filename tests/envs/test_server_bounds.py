"""What the env server sends back for oversized input (issue 54, "at the servers"; echo bundle, real uvicorn):

* a 5 MB hostile frame gets an error reply of a few hundred bytes that echoes a bounded prefix and says it was
  cut, over `/ws` and `/mcp`, and the session goes on;
* a 17 MiB `/mcp` body gets its 413 even from Python's http.client, which sends the whole body before reading
  (with and without `Connection: close`, declared or chunked); one declared past the drain bound is answered at
  once, without waiting for a body.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect

from agentrl.envs.server import build_app, serve_in_background, wire
from agentrl.envs.server.echo import EchoBundle
from agentrl.envs.server.mcp_routes import MAX_BODY_BYTES
from agentrl.testing.stdlib_http import declared_only, oversized_json, stdlib_post
from agentrl.uvicorn_servers import DRAIN_BYTES

FIVE_MB = 5_000_000
REPLY_BOUND = 4000  # bytes: room for a reply's own text and a bounded echo, far below the frame's size


@pytest.fixture(scope="module")
def served():
    app = build_app(EchoBundle(), max_concurrent_envs=4)
    with serve_in_background(app) as base:
        yield base, app


def ws_url(url: str, path: str) -> str:
    return url.replace("http://", "ws://") + path


HOSTILE_WS_FRAMES = {  # frame -> what the reply must still say about it
    "unknown type": ({"type": "x" * FIVE_MB}, "UNKNOWN_TYPE"),
    "reset data not an object": ({"type": "reset", "data": "y" * FIVE_MB}, "VALIDATION_ERROR"),
    "step with a huge unknown key": ({"type": "step", "data": {"tool_name": 1, "z" * FIVE_MB: 1}}, "VALIDATION_ERROR"),
    "step with a huge extra value": ({"type": "step", "data": {"tool_name": 1, "z": "q" * FIVE_MB}}, "VALIDATION_ERROR"),
    "a huge unknown tool": ({"type": "step", "data": {"tool_name": "n" * FIVE_MB}}, "tool_not_found"),
    "a huge unknown split": ({"type": "reset", "data": {"split": "s" * FIVE_MB, "index": 0}}, "there is no split"),
    "200,000 unknown keys": ({"type": "step", "data": {"tool_name": "t", **{f"k{i}": i for i in range(200_000)}}},
                             "errors_cut"),
    "an mcp call of a huge tool": ({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                            "params": {"name": "n" * FIVE_MB}}}, "-32603"),
}


@pytest.mark.parametrize("case", list(HOSTILE_WS_FRAMES))
def test_a_hostile_frame_gets_a_bounded_reply_and_the_session_lives_on(served, case):
    url, _ = served
    frame, expected = HOSTILE_WS_FRAMES[case]
    text = json.dumps(frame)

    async def probe() -> tuple[str, dict]:
        async with connect(ws_url(url, "/ws"), max_size=None) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"split": "eval", "index": 0}}))
            await asyncio.wait_for(ws.recv(), 60)
            await ws.send(text)
            reply = await asyncio.wait_for(ws.recv(), 120)
            await ws.send(json.dumps({"type": "reset", "data": {"split": "eval", "index": 1}}))
            after = json.loads(await asyncio.wait_for(ws.recv(), 60))
            return reply, after

    reply, after = asyncio.run(probe())
    assert len(reply) < REPLY_BOUND, (case, len(reply), reply[:300])
    assert expected in reply, reply[:REPLY_BOUND]
    if case != "200,000 unknown keys":
        assert "more characters cut" in reply, reply  # the echo says it is partial
    json.loads(reply)  # still one strict JSON frame
    assert after["type"] == "observation" and after["data"]["done"] is False, after


def test_the_echo_keeps_a_prefix_a_client_can_recognise(served):
    url, _ = served

    async def probe() -> dict:
        async with connect(ws_url(url, "/ws"), max_size=None) as ws:
            await ws.send(json.dumps({"type": "garbage-" + "x" * FIVE_MB}))
            return json.loads(await asyncio.wait_for(ws.recv(), 120))

    data = (asyncio.run(probe()))["data"]
    prefix = "garbage-" + "x" * (wire.ECHO_CHARS - len("garbage-"))
    assert data["message"] == f"Unknown message type: {prefix}... [{FIVE_MB + 8 - wire.ECHO_CHARS} more characters cut]"
    # a short unknown type is echoed whole, as before
    async def short() -> dict:
        async with connect(ws_url(url, "/ws")) as ws:
            await ws.send(json.dumps({"type": "nope"}))
            return json.loads(await asyncio.wait_for(ws.recv(), 60))

    assert asyncio.run(short())["data"]["message"] == "Unknown message type: nope"


def chunks(total: int, size: int = 1 << 20):
    body = oversized_json(total)
    for start in range(0, total, size):
        yield body[start:start + size]


@pytest.mark.parametrize("how", ["declared", "declared, Connection: close", "chunked, Connection: close"])
def test_a_17_mib_mcp_body_gets_its_413_through_http_client(served, how):
    url, _ = served
    size = 17 << 20
    assert size > MAX_BODY_BYTES
    headers = {"Connection": "close"} if "close" in how else {}
    body = chunks(size) if how.startswith("chunked") else oversized_json(size)
    status, reply_headers, reply = stdlib_post(url, "/mcp", body, headers)  # a generator goes chunked
    assert status == 413, reply[:300]
    assert reply_headers["connection"] == "close"
    error = json.loads(reply)["error"]
    assert error["code"] == -32600 and str(MAX_BODY_BYTES) in error["message"], error
    status, _, reply = stdlib_post(url, "/mcp", json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "openenv/session/create", "params": {}}).encode())
    assert status == 200 and "session_id" in json.loads(reply)["result"], reply


def test_a_body_declared_past_the_drain_bound_is_answered_without_waiting_for_it(served):
    url, _ = served
    reply = declared_only(url, "/mcp", MAX_BODY_BYTES + DRAIN_BYTES + 1, timeout=120)  # no body ever comes
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert b"connection: close" in reply.lower()
