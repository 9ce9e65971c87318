"""OpenEnv 0.10's production mode on our server: `/mcp` JSON-RPC over HTTP and WebSocket, `/ws?session_id=`,
under auth, hostile requests, capacity and expiry (echo test bundle, real uvicorn, real clients)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import EnvironmentMetadata, SchemaResponse
from openenv.core.mcp_client import MCPToolClient
from websockets.asyncio.client import connect

from agentrl.envs.server import build_app, serve_in_background
from agentrl.envs.server.echo import EchoBundle
from agentrl.testing.wait import wait_until


def rpc(method: str, rid: object = 1, **params) -> dict:
    return {"jsonrpc": "2.0", "method": method, "params": params, "id": rid}


def post(url: str, body: object, **kw) -> httpx.Response:
    content = body if isinstance(body, str | bytes) else json.dumps(body)
    return httpx.post(f"{url}/mcp", content=content, headers={"content-type": "application/json", **kw}, timeout=60)


def create(url: str) -> str:
    reply = post(url, rpc("openenv/session/create")).json()
    return reply["result"]["session_id"]


def ws_url(url: str, path: str = "/ws") -> str:
    return url.replace("http://", "ws://") + path


async def ask(ws, frame) -> dict:
    await ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))
    return json.loads(await asyncio.wait_for(ws.recv(), 60))


@pytest.fixture(scope="module")
def served():
    app = build_app(EchoBundle(), max_concurrent_envs=8)
    with serve_in_background(app) as base:
        yield base, app


def test_a_joined_websocket_and_http_tools_share_one_episode(served):
    url, app = served

    async def play() -> None:
        sid = create(url)
        async with connect(ws_url(url) + f"?session_id={sid}") as ws:
            reset = await ask(ws, {"type": "reset", "data": {"split": "eval", "index": 1}})
            assert reset["data"]["done"] is False
            listed = post(url, rpc("tools/list", 2, session_id=sid)).json()
            assert listed["id"] == 2 and [t["name"] for t in listed["result"]["tools"]][0] == "echo"
            echoed = post(url, rpc("tools/call", "a", session_id=sid, name="echo", arguments={"text": "hi"})).json()
            assert echoed["id"] == "a" and echoed["result"]["data"] == "hi" and echoed["result"]["done"] is False
            # The HTTP call counted in the episode the WebSocket sees.
            assert (await ask(ws, {"type": "state"}))["data"]["step_count"] == 1
            end = post(url, rpc("tools/call", 3, session_id=sid, name="end_turn",
                                arguments={"response": "answer-eval-1"})).json()["result"]
            assert (end["reward"], end["done"], end["metadata"]["scores"]) == (1.0, True, {"match": 1.0})
            assert "data" not in end  # so MCPToolClient.call_tool returns the scored observation
            # Closing while the WebSocket holds it: it ends when the WebSocket leaves.
            closing = post(url, rpc("openenv/session/close", 4, session_id=sid)).json()["result"]
            assert closing == {"session_id": sid, "closed": False, "closing": True}
        assert wait_until(lambda: len(app.state.sessions) == 0)
        gone = post(url, rpc("tools/list", 5, session_id=sid)).json()
        assert gone["error"]["code"] == -32602 and "Unknown session_id" in gone["error"]["message"]

    asyncio.run(play())


def test_mcp_tool_client_errors_and_reconnect(served):
    url, app = served
    with MCPToolClient(base_url=url, message_timeout_s=60).sync() as env:
        with pytest.raises(RuntimeError, match="the episode has ended; call reset"):
            env.call_tool("echo", text="before reset")
        env.reset(split="train", index=2)
        with pytest.raises(RuntimeError, match="tool_not_found: there is no tool 'nope'"):
            env.call_tool("nope")
        scored = env.call_tool("end_turn", response="answer-train-2")
        assert (scored["reward"], scored["done"]) == (1.0, True)
        r = env.reset(split="train", index=0)
        assert r.done is False
        r = env.step(CallToolAction(tool_name="end_turn", arguments={"response": "wrong"}))
        assert (r.reward, r.done) == (0.0, True)
    # The client's close detached the WebSocket and closed the session: nothing is left.
    assert wait_until(lambda: len(app.state.sessions) == 0 and not app.state.served.sessions)


def test_joining_refuses_unknown_and_second_websockets(served):
    url, _ = served

    async def check() -> None:
        async with connect(ws_url(url) + "?session_id=" + "x" * 5000) as ws:
            reply = json.loads(await ws.recv())
            assert reply["data"]["code"] == "SESSION_ERROR" and "Unknown session_id" in reply["data"]["message"]
            assert len(reply["data"]["message"]) < 200
            with pytest.raises(websockets.ConnectionClosedOK):
                await ws.recv()
        sid = create(url)
        async with connect(ws_url(url) + f"?session_id={sid}"), connect(ws_url(url) + f"?session_id={sid}") as ws2:
            reply = json.loads(await ws2.recv())
            assert "already has an attached WebSocket" in reply["data"]["message"]
        # Detached again: it can be joined anew, then closed for good.
        async with connect(ws_url(url) + f"?session_id={sid}") as ws3:
            assert (await ask(ws3, {"type": "state"}))["type"] == "state"
        assert post(url, rpc("openenv/session/close", session_id=sid)).json()["result"]["closed"] is True

    asyncio.run(check())


HOSTILE = [
    # (body, JSON-RPC error code, the reply's id)
    ("{not json", -32700, None),
    (b"\xff\xfe\x00garbage", -32700, None),
    ('{"jsonrpc": "2.0", "method": "tools/list", "id": NaN}', -32700, None),
    ('{"jsonrpc": "2.0", "method": "tools/call", "params": {"arguments": {"x": Infinity}}, "id": 1}', -32700, None),
    ('{"jsonrpc": "2.0", "method": "tools/list", "id": ' + "9" * 5000 + "}", -32700, None),
    ("[" * 5000 + "]" * 5000, -32700, None),
    ([rpc("tools/list")], -32600, None),
    ("42", -32600, None),
    (rpc("tools/list", rid=2**64), -32600, None),
    (rpc("tools/list", rid="i" * 5000), -32600, None),
    (rpc("tools/list", rid=1.5), -32600, None),
    (rpc("tools/list", rid=True), -32600, None),
    ({"jsonrpc": "1.0", "method": "tools/list", "id": 7}, -32600, 7),
    ({"jsonrpc": "2.0", "id": 7}, -32600, 7),
    ({"jsonrpc": "2.0", "method": "tools/list", "params": [1], "id": 7}, -32600, 7),
    ({**rpc("tools/list", 7), "extra": 1}, -32600, 7),
    (rpc("frobnicate", 8), -32601, 8),
    (rpc("tools/list", 9), -32602, 9),  # no session_id
    (rpc("tools/call", 10, session_id="nope", name="echo"), -32602, 10),
    (rpc("tools/call", 11, session_id="nope"), -32602, 11),  # no name
    (rpc("tools/call", 12, session_id="nope", name="echo", arguments=[1]), -32602, 12),
    (rpc("openenv/session/close", 13), -32602, 13),
    (rpc("openenv/session/close", 14, session_id={"a": 1}), -32602, 14),
    (rpc("tools/list", 15, session_id=["x"]), -32602, 15),
]


@pytest.mark.parametrize("body,code,rid", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_http_requests_get_json_rpc_errors(served, body, code, rid):
    url, app = served
    reply = post(url, body)
    assert reply.status_code == 200
    data = reply.json()
    assert data["jsonrpc"] == "2.0" and "result" not in data, data
    assert (data["error"]["code"], data["id"]) == (code, rid), data
    assert len(reply.content) < 2000  # nothing a client sent is echoed back at length
    assert httpx.get(f"{url}/health").status_code == 200 and len(app.state.sessions) == 0


def test_oversized_body_is_413_and_the_server_lives_on(served):
    url, _ = served
    big = json.dumps(rpc("tools/list", session_id="s" * (17 * 1024 * 1024)))
    reply = post(url, big)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == -32600
    sid = create(url)
    assert post(url, rpc("openenv/session/close", session_id=sid)).json()["result"]["closed"] is True


def test_mcp_websocket_own_session_survives_garbage(served):
    url, app = served

    async def check() -> None:
        async with connect(ws_url(url, "/mcp")) as ws:
            own = (await ask(ws, rpc("openenv/session/create")))["result"]["session_id"]
            for frame, code in [("{bad", -32700), (b"\xff", -32700), ("[]", -32600), ('{"id": NaN}', -32700),
                                (rpc("tools/list", 2**70), -32600), (rpc("nope/nope"), -32601),
                                (rpc("openenv/session/close", session_id=own), -32600)]:
                assert (await ask(ws, frame))["error"]["code"] == code, frame
            # The session is the connection's own: a /ws may join it to reset, and its tools answer here.
            async with connect(ws_url(url) + f"?session_id={own}") as joined:
                assert (await ask(joined, {"type": "reset", "data": {"split": "eval", "index": 0}}))["data"]["done"] is False
            listed = await ask(ws, rpc("tools/list", 3))
            assert [t["name"] for t in listed["result"]["tools"]][-1] == "end_turn"
            end = await ask(ws, rpc("tools/call", 4, name="end_turn", arguments={"response": "answer-eval-0"}))
            assert (end["id"], end["result"]["reward"]) == (4, 1.0)
            assert len(app.state.sessions) == 1
        assert wait_until(lambda: len(app.state.sessions) == 0)

    asyncio.run(check())


def test_metadata_and_schema_as_openenv_010_serves_them(served):
    url, _ = served
    meta = httpx.get(f"{url}/metadata").json()
    assert meta.pop("splits") == {"all": 5, "train": 3, "eval": 2}  # our one addition, for the rows writer
    assert EnvironmentMetadata.model_validate(meta).name == "echo"
    schema = SchemaResponse.model_validate(httpx.get(f"{url}/schema").json())
    assert "tool_name" in schema.action["properties"]


def test_auth_guards_mcp_over_http_and_websocket():
    app = build_app(EchoBundle(), token="s3cret")
    with serve_in_background(app) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            reply = post(url, rpc("openenv/session/create"), **headers)
            assert reply.status_code == 401

        async def refused() -> int:
            async with connect(ws_url(url, "/mcp")) as ws:
                with pytest.raises(websockets.ConnectionClosed) as ei:
                    await ws.recv()
                return ei.value.rcvd.code

        assert asyncio.run(refused()) == 1008
        assert len(app.state.sessions) == 0
        sid = post(url, rpc("openenv/session/create"), Authorization="Bearer s3cret").json()["result"]["session_id"]
        assert post(url, rpc("openenv/session/close", session_id=sid), Authorization="Bearer s3cret").json()[
            "result"]["closed"] is True


def test_capacity_counts_every_kind_of_session():
    app = build_app(EchoBundle(), max_concurrent_envs=2)
    with serve_in_background(app) as url:
        first, second = create(url), create(url)
        full = post(url, rpc("openenv/session/create", 9)).json()
        assert full["id"] == 9 and full["error"]["code"] == -32000
        assert full["error"]["data"] == {"active_sessions": 2, "max_sessions": 2}

        async def refused(path: str) -> dict:
            async with connect(ws_url(url, path)) as ws:
                return json.loads(await ws.recv())

        assert asyncio.run(refused("/ws"))["data"]["code"] == "CAPACITY_REACHED"
        assert asyncio.run(refused("/mcp"))["error"]["data"] == {"active_sessions": 2, "max_sessions": 2}
        # Joining an existing session takes no new slot.
        async def join() -> dict:
            async with connect(ws_url(url) + f"?session_id={first}") as ws:
                return await ask(ws, {"type": "state"})

        assert asyncio.run(join())["type"] == "state"
        post(url, rpc("openenv/session/close", session_id=second))
        assert wait_until(lambda: "result" in post(url, rpc("openenv/session/create")).json())


def test_a_session_never_joined_or_closed_expires():
    app = build_app(EchoBundle(), max_concurrent_envs=1, session_idle_timeout=0.5)
    with serve_in_background(app) as url:
        sid = create(url)
        # Held by a joined WebSocket it does not expire, however long it sits.
        async def hold() -> None:
            async with connect(ws_url(url) + f"?session_id={sid}") as ws:
                assert (await ask(ws, {"type": "reset", "data": {"split": "eval", "index": 0}}))["data"]["done"] is False
                await asyncio.sleep(2.0)
                assert (await ask(ws, {"type": "state"}))["data"]["done"] is False

        asyncio.run(hold())
        # Left alone, it ends (episode torn down, slot freed) and the next client gets the slot.
        assert wait_until(lambda: len(app.state.sessions) == 0 and not app.state.served.sessions, timeout=120)
        gone = post(url, rpc("tools/list", 1, session_id=sid)).json()
        assert "Unknown session_id" in gone["error"]["message"]
        assert "result" in post(url, rpc("openenv/session/create")).json()


def test_build_app_refuses_a_bad_idle_timeout():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="session_idle_timeout"):
            build_app(EchoBundle(), session_idle_timeout=bad)


def test_tool_timeout_over_http_ends_the_episode_and_the_server_answers_meanwhile(tmp_path):
    app = build_app(EchoBundle(marker_dir=str(tmp_path)), tool_timeout=0.3)
    with serve_in_background(app) as url:

        async def scenario() -> None:
            sid = create(url)
            async with connect(ws_url(url) + f"?session_id={sid}") as ws:
                await ask(ws, {"type": "reset", "data": {"split": "eval", "index": 0}})
                slow = asyncio.create_task(asyncio.to_thread(
                    post, url, rpc("tools/call", 1, session_id=sid, name="sleep", arguments={"seconds": 1.5})))
                # Another session is served while that call blocks.
                assert await asyncio.to_thread(lambda: "result" in post(url, rpc("openenv/session/create")).json())
                error = (await slow).json()["error"]
                assert error["code"] == -32603 and error["message"].startswith("timeout: the tool call 'sleep'")
                assert error["data"]["done"] is True and error["data"]["metadata"]["failure"] == "tool_timeout"

        asyncio.run(scenario())
        # The timed-out episode is torn down once its stuck call returns.
        assert wait_until(lambda: any("echo-eval-0" in p.name for p in tmp_path.glob("closed-*")), 30)


def test_sessions_left_open_are_torn_down_at_shutdown(tmp_path):
    app = build_app(EchoBundle(marker_dir=str(tmp_path)), max_concurrent_envs=4)
    with serve_in_background(app) as url:

        async def leave_open() -> None:
            for i in range(2):  # reset over a joined WebSocket, then leave without closing the session
                async with connect(ws_url(url) + f"?session_id={create(url)}") as ws:
                    await ask(ws, {"type": "reset", "data": {"split": "train", "index": i}})

        asyncio.run(leave_open())
        assert len(app.state.sessions) == 2 and app.state.served.sandbox.live == 2
    assert len(list(tmp_path.glob("closed-*"))) == 2 and app.state.served.sandbox.live == 0
