"""Strict JSON both ways (issue 26, item 3): NaN, Infinity, -Infinity and 1e400 in a client frame are refused at
parse time with the protocol's error and never reach a tool; no reply holds them; the client refuses a server's
non-standard JSON with a clear error. Real uvicorn servers (echo and GridSim bundles), raw WebSocket frames."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from agentrl.envs import strict_json
from agentrl.envs.bundles import load_bundle
from agentrl.envs.client import EnvProtocolError, EpisodeClient
from agentrl.envs.server import build_app, serve_in_background
from agentrl.envs.server.echo import EchoBundle, EchoEpisode

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


def not_json(constant: str) -> None:
    raise AssertionError(f"the reply holds {constant}, which is not JSON")


async def ask(ws, frame: str | dict) -> dict:
    """Send one frame; its reply, parsed as strict JSON (a JavaScript client must be able to read it)."""
    await ws.send(frame if isinstance(frame, str) else json.dumps(frame))
    raw = await asyncio.wait_for(ws.recv(), 60)
    reply = json.loads(raw, parse_constant=not_json)
    assert not any(math.isinf(x) for x in _floats(reply)), raw  # 1e400 echoed back would read as inf
    return reply


def _floats(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list):
        for v in value:
            yield from _floats(v)


def ws_of(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


@pytest.fixture(scope="module")
def echo_url():
    with serve_in_background(build_app(EchoBundle())) as url:
        yield url


@pytest.fixture(scope="module")
def gridsim():
    return load_bundle("gridsim")


@pytest.mark.parametrize("bad", NON_FINITE)
async def test_a_non_finite_json_rpc_id_gets_a_strict_json_error(echo_url, bad):
    async with connect(ws_of(echo_url)) as ws:
        await ask(ws, {"type": "reset", "data": {"split": "eval", "index": 0}})
        for method in ("tools/list", "tools/call", "no/such"):
            frame = ('{"type": "mcp", "data": {"jsonrpc": "2.0", "id": ' + bad + ', "method": "' + method
                     + '", "params": {"name": "echo", "arguments": {"text": "x"}}}}')
            reply = await ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
            assert "not a JSON number" in reply["data"]["message"] or "too large" in reply["data"]["message"]
        # The session lives on; an id the protocol allows is echoed as it came.
        rpc = {"jsonrpc": "2.0", "id": "r-1", "method": "tools/call", "params": {"name": "echo",
                                                                                 "arguments": {"text": "ok"}}}
        reply = await ask(ws, {"type": "mcp", "data": rpc})
        assert reply["data"]["id"] == "r-1" and reply["data"]["result"]["result"]["data"] == "ok"
        assert (await ask(ws, {"type": "state"}))["data"]["step_count"] == 1


async def test_an_id_json_rpc_forbids_gets_invalid_request_with_id_null(echo_url):
    async with connect(ws_of(echo_url)) as ws:
        for rid in ({"a": 1}, [1], True):
            reply = await ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": rid, "method": "tools/list"}})
            assert reply["type"] == "mcp" and reply["data"]["id"] is None, reply
            assert reply["data"]["error"]["code"] == -32600 and "id" in reply["data"]["error"]["message"]


@pytest.mark.parametrize("where", ["step", "step_nested", "mcp", "reset", "metadata"])
async def test_non_finite_numbers_anywhere_in_a_frame_are_refused_before_any_tool(echo_url, where):
    frames = {
        "step": '{"type": "step", "data": {"tool_name": "sleep", "arguments": {"seconds": %s}}}',
        "step_nested": '{"type": "step", "data": {"type": "call_tool", "tool_name": "echo", '
                       '"arguments": {"text": "x", "extra": [1, {"n": %s}]}}}',
        "mcp": '{"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
               '"params": {"name": "finish", "arguments": {"answer": %s}}}}',
        "reset": '{"type": "reset", "data": {"split": "eval", "index": 1, "seed": %s}}',
        "metadata": '{"type": "step", "data": {"tool_name": "echo", "arguments": {"text": "x"}, '
                    '"metadata": {"t": %s}}}',
    }
    async with connect(ws_of(echo_url)) as ws:
        await ask(ws, {"type": "reset", "data": {"split": "eval", "index": 0}})
        for bad in NON_FINITE:
            reply = await ask(ws, frames[where] % bad)
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", (bad, reply)
        state = (await ask(ws, {"type": "state"}))["data"]
        assert state["step_count"] == 0 and state["task_id"] == "echo-eval-0"  # no tool ran, no reset happened
        done = (await ask(ws, {"type": "step", "data": {"tool_name": "end_turn",
                                                         "arguments": {"response": "answer-eval-0"}}}))["data"]
        assert (done["reward"], done["done"]) == (1.0, True)


async def test_nan_in_tool_arguments_does_not_use_up_a_submission(gridsim):
    """GridSim allows 4 submissions; a frame with NaN in the schedule must not spend one."""
    with serve_in_background(build_app(gridsim)) as url:
        async with connect(ws_of(url)) as ws:
            await ask(ws, {"type": "reset", "data": {"split": "eval", "index": 0}})
            for bad in NON_FINITE:
                schedule = ", ".join([bad] + ["0"] * 23)
                for frame in (
                    '{"type": "step", "data": {"tool_name": "submit_schedule", "arguments": {"schedule": [S]}}}',
                    '{"type": "mcp", "data": {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": '
                    '{"name": "submit_schedule", "arguments": {"schedule": [S]}}}}',
                ):
                    reply = await ask(ws, frame.replace("[S]", f"[{schedule}]"))
                    assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
            # The first real submission is the first one counted: 3 are left after it.
            reply = await ask(ws, {"type": "step", "data": {"tool_name": "submit_schedule",
                                                             "arguments": {"schedule": [-1] * 24}}})
            feedback = json.loads(reply["data"]["observation"]["result"]["data"])
            assert feedback["feasible"] is False and feedback["submissions_left"] == 3, feedback


class NaNScoreBundle(EchoBundle):
    """Echo tasks whose episode scores NaN: a bundle bug the server must report, not put on the wire."""

    def episode(self, split: str, index: int) -> EchoEpisode:
        episode = super().episode(split, index)
        episode.scores = lambda: {"match": float("nan")}  # type: ignore[method-assign]
        return episode


@pytest.mark.parametrize("case", ["nan_score", "nan_reward"])
async def test_a_non_finite_score_or_reward_never_reaches_the_wire(case):
    app = (build_app(NaNScoreBundle()) if case == "nan_score"
           else build_app(EchoBundle(), reward=lambda scores: float("inf")))
    with serve_in_background(app) as url:
        async with connect(ws_of(url)) as ws:
            await ask(ws, {"type": "reset", "data": {"split": "eval", "index": 0}})
            data = (await ask(ws, {"type": "step", "data": {"tool_name": "end_turn",
                                                             "arguments": {"response": "answer-eval-0"}}}))["data"]
    assert data["done"] is True and data["reward"] is None
    meta = data["metadata"]
    if case == "nan_score":
        assert meta["failure"] == "env_error" and "match=nan, not a finite number" in meta["error"]
    else:
        assert meta["failure"] == "reward_error" and "the reward is inf" in meta["error"]
        assert meta["scores"] == {"match": 1.0}


# -- the client ---------------------------------------------------------------------------------------------------


async def test_the_client_refuses_a_server_that_writes_nan():
    """A server (another implementation) that writes `NaN`: a clear EnvProtocolError, not a NaN reward."""
    replies = {
        "reset": '{"type": "observation", "data": {"observation": {"metadata": {"prompt": "p"}}, "reward": null, '
                 '"done": false}}',
        "list_tools": '{"type": "observation", "data": {"observation": {"tools": []}, "reward": null, "done": false}}',
        "call": '{"type": "observation", "data": {"observation": {"tool_name": "end_turn", "result": null, '
                '"error": null}, "reward": NaN, "done": true}}',
    }

    async def handler(ws) -> None:
        async for raw in ws:
            frame = json.loads(raw)
            kind = frame["type"] if frame["type"] != "step" else (
                "list_tools" if frame["data"].get("type") == "list_tools" else "call")
            await ws.send(replies[kind])

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with EpisodeClient(f"http://127.0.0.1:{port}", reset_timeout=30) as env:
            await env.reset("eval", 0)
            with pytest.raises(EnvProtocolError, match="not strict JSON.*NaN is not a JSON number"):
                await env.end_turn("done")


async def test_the_client_refuses_to_send_nan_and_the_episode_goes_on(echo_url):
    async with EpisodeClient(echo_url) as env:
        await env.reset("eval", 1)
        with pytest.raises(ValueError, match="arguments of 'sleep' are not JSON"):
            await env.call("sleep", {"seconds": float("nan")})
        assert (await env.call("echo", {"text": "still here"})).text == "still here"
        assert (await env.state())["step_count"] == 1
        assert (await env.end_turn("answer-eval-1")).reward == 1.0


def test_strict_json_reads_and_writes_only_json():
    assert strict_json.loads('{"a": [1, 2.5, -1e308, 1e-400]}') == {"a": [1, 2.5, -1e308, 0.0]}
    for bad in NON_FINITE:
        with pytest.raises(ValueError, match=r"not a JSON number|too large"):
            strict_json.loads('{"a": ' + bad + "}")
    with pytest.raises(ValueError):
        strict_json.dumps({"a": float("nan")})
    assert strict_json.non_finite_as_text({"a": [float("inf"), (float("nan"),)]}) == {"a": ["inf", ["nan"]]}
