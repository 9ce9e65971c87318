"""The env server against openenv 0.10's own clients and raw WebSocket frames (echo test bundle)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import websockets
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from websockets.asyncio.client import connect

from agentrl.envs.sandbox.base import EpisodeHandle, SandboxError
from agentrl.envs.sandbox.local import LocalSandbox
from agentrl.envs.server import build_app, serve_in_background
from agentrl.envs.server.echo import EchoBundle
from agentrl.testing.wait import wait_until


def ws_of(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


async def ask(ws, frame) -> dict:
    await ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))
    return json.loads(await asyncio.wait_for(ws.recv(), 60))


def reset(split: str, index: int) -> dict:
    return {"type": "reset", "data": {"split": split, "index": index}}


def call(name: str, **arguments) -> dict:
    return {"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments}}


def markers(folder: Path) -> list[Path]:
    return sorted(folder.glob("closed-*"))


@pytest.fixture(scope="module")
def url():
    with serve_in_background(build_app(EchoBundle())) as base:
        yield base


def test_mcp_tool_client_plays_an_episode(url):
    with MCPToolClient(base_url=url, message_timeout_s=30).sync() as env:
        r = env.reset(split="eval", index=1)
        assert not r.done and r.reward is None
        meta = r.observation.metadata
        assert meta["prompt"].endswith("reply answer-eval-1.") and meta["system_prompt"]
        assert meta["task"] == {"id": "echo-eval-1", "split": "eval", "index": 1, "toolset": "default"}
        tools = env.list_tools(use_cache=False)
        assert [t.name for t in tools] == ["echo", "sleep", "finish", "end_turn"]
        # OpenAI `parameters` become MCP `input_schema`.
        assert tools[0].input_schema["required"] == ["text"] and tools[0].description == "Return the text unchanged."
        assert env.call_tool("echo", text="héllo") == "héllo"
        with pytest.raises(RuntimeError, match="tool_not_found"):
            env.call_tool("nope")
        r = env.step(CallToolAction(tool_name="end_turn", arguments={"response": "answer-eval-1"}))
        assert (r.reward, r.done) == (1.0, True)
        assert r.observation.metadata["scores"] == {"match": 1.0}
        assert env.state().step_count == 2  # echo and end_turn; the unknown tool and list_tools do not count
        # A fresh episode on the same connection; a wrong reply scores 0.
        env.reset(split="train", index=0)
        r = env.step(CallToolAction(tool_name="end_turn", arguments={"response": "nope"}))
        assert (r.reward, r.done) == (0.0, True)


def test_generic_client_sees_the_wire(url):
    with GenericEnvClient(base_url=url).sync() as env:
        r = env.reset(split="all", index=3)  # train has 3 tasks, so all/3 is eval/0
        assert r.observation["metadata"]["task"]["id"] == "echo-eval-0"
        st = env.state()
        assert st["task_id"] == "echo-eval-0" and st["split"] == "all" and st["index"] == 3 and st["done"] is False
        # A tool result with done=True ends the episode: reward and done come on that call.
        r = env.step({"type": "call_tool", "tool_name": "finish", "arguments": {"answer": "answer-eval-0"}})
        assert (r.reward, r.done) == (1.0, True)
        assert r.observation["result"]["data"] == "graded"
        assert r.observation["metadata"]["scores"] == {"match": 1.0}
        r = env.step({"type": "call_tool", "tool_name": "echo", "arguments": {"text": "x"}})
        assert r.done and r.reward is None
        assert r.observation["metadata"]["error"] == "the episode has ended; call reset"
        assert env.state()["done"] is True


async def test_wire_frames_carry_metadata_twice(url):
    async with connect(ws_of(url)) as ws:
        data = (await ask(ws, reset("train", 2)))["data"]
        assert data["metadata"] == data["observation"]["metadata"] and data["metadata"]["prompt"]
        assert data["reward"] is None and data["done"] is False
        reply = await ask(ws, call("echo", text="a"))
        assert reply == {
            "type": "observation",
            "data": {
                "observation": {
                    "tool_name": "echo",
                    "result": {"content": [{"type": "text", "text": "a"}], "structured_content": None,
                               "meta": None, "data": "a", "is_error": False},
                    "error": None,
                    "metadata": {},
                },
                "reward": None,
                "done": False,
            },
        }
        bad = (await ask(ws, call("echo", text=3)))["data"]  # the episode answers malformed arguments
        assert bad["observation"]["error"]["error_type"] == "execution_error" and not bad["done"]
        await ws.send(json.dumps({"type": "close"}))
        with pytest.raises(websockets.ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), 60)


async def test_bad_input_gets_an_error_and_the_session_stays_usable(url):
    async with connect(ws_of(url)) as ws:
        cases = [
            ("{not json", "INVALID_JSON"),
            ("[1, 2]", "UNKNOWN_TYPE"),
            ({"type": "frobnicate"}, "UNKNOWN_TYPE"),
            ({"data": {}}, "UNKNOWN_TYPE"),
            ({"type": "step"}, "VALIDATION_ERROR"),
            ({"type": "state", "extra": 1}, "VALIDATION_ERROR"),
            ({"type": "step", "data": {"type": "call_tool"}}, "VALIDATION_ERROR"),
            ({"type": "reset", "data": {"split": "eval", "index": "0"}}, "VALIDATION_ERROR"),
        ]
        for frame, code in cases:
            reply = await ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (frame, reply)
        assert (await ask(ws, reset("eval", 0)))["data"]["done"] is False
        # Non-object arguments: a validation error naming `arguments`; the episode goes on.
        reply = await ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "echo", "arguments": [1]}})
        assert reply["data"]["code"] == "VALIDATION_ERROR" and reply["data"]["errors"][0]["loc"] == ["arguments"]
        reply = await ask(ws, call("no_such_tool"))
        obs = reply["data"]["observation"]
        assert obs["error"]["error_type"] == "tool_not_found" and "echo" in obs["error"]["message"]
        assert reply["data"]["done"] is False
        # A binary frame holding JSON is read like a text frame.
        reply = await ask(ws, json.dumps(call("echo", text="bin")).encode())
        assert reply["data"]["observation"]["result"]["data"] == "bin"
        assert (await ask(ws, {"type": "state"}))["data"]["step_count"] == 1  # unknown tools do not count
        # Refused resets: error observations (done, status error), and the session stays usable.
        for frame, message in [
            (reset("nope", 0), "there is no split 'nope'; the splits are all, train, eval"),
            (reset("eval", 2), "split 'eval' has 2 tasks, so it has no task 2"),
            (reset("all", -1), "split 'all' has 5 tasks, so it has no task -1"),
            ({"type": "reset", "data": {"split": "eval"}}, "split and index go together"),
        ]:
            data = (await ask(ws, frame))["data"]
            assert data["done"] is True and data["reward"] is None
            assert data["metadata"]["status"] == "error" and data["metadata"]["error"].startswith(message)
        # No split and index: the first task served.
        data = (await ask(ws, {"type": "reset"}))["data"]
        assert data["metadata"]["task"]["id"] == "echo-train-0"
        data = (await ask(ws, call("end_turn", response="answer-train-0")))["data"]
        assert (data["reward"], data["done"]) == (1.0, True)


async def test_deeply_nested_frames_get_an_error_and_the_session_lives_on(url):
    deep_list = "[" * 1000 + "]" * 1000  # 2 KB: Python's JSON decoder raises RecursionError on it
    deep_args = json.dumps(call("echo", text="x"))[:-3] + ', "nested": ' + '{"a": ' * 990 + "1" + "}" * 990 + "}}}"
    deep_reset = '{"type": "reset", "data": {"split": ' + "[" * 5000 + "]" * 5000 + "}}"
    async with connect(ws_of(url)) as ws:
        assert (await ask(ws, reset("eval", 0)))["data"]["done"] is False
        for frame in (deep_list, deep_args, deep_reset, deep_list.encode()):
            reply = await ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
            assert "nested deeper than" in reply["data"]["message"]
        # Nesting within the limit reaches the tool, which answers as for any bad argument.
        ok_depth = {"type": "step", "data": {"tool_name": "echo", "arguments": {"text": "y", "n": [[[[1]]]] * 3}}}
        assert (await ask(ws, ok_depth))["data"]["observation"]["result"]["data"] == "y"
        # The episode opened before the bad frames is still live on the same connection.
        data = (await ask(ws, call("end_turn", response="answer-eval-0")))["data"]
        assert (data["reward"], data["done"]) == (1.0, True)


async def test_mcp_frames(url):
    async with connect(ws_of(url)) as ws:
        await ask(ws, reset("eval", 0))
        reply = await ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}})
        assert [t["name"] for t in reply["data"]["result"]["tools"]][-1] == "end_turn"
        assert "inputSchema" in reply["data"]["result"]["tools"][0]
        rpc = {"jsonrpc": "2.0", "method": "tools/call", "id": 2, "params": {"name": "echo", "arguments": {"text": "z"}}}
        reply = await ask(ws, {"type": "mcp", "data": rpc})
        assert reply["data"]["id"] == 2 and reply["data"]["result"]["result"]["data"] == "z"
        reply = await ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "x/y", "id": 3}})
        assert reply["data"]["error"]["code"] == -32601


def test_http_routes(url):
    assert httpx.get(f"{url}/health").json() == {"status": "healthy",
                                                  "sandbox": {"status": "healthy", "kind": "local", "episodes": 0}}
    schema = httpx.get(f"{url}/schema").json()
    assert set(schema) == {"action", "observation", "state"}
    assert "tool_name" in schema["action"]["properties"]
    meta = httpx.get(f"{url}/metadata").json()
    assert meta["name"] == "echo" and meta["version"] == "1"
    assert meta["splits"] == {"all": 5, "train": 3, "eval": 2}


def test_capacity():
    with serve_in_background(build_app(EchoBundle(), max_concurrent_envs=1)) as url:
        a = MCPToolClient(base_url=url).sync()
        a.connect()
        a.reset(split="eval", index=0)
        b = MCPToolClient(base_url=url).sync()
        try:  # 0.10's client opens its session over /mcp first: the refusal comes as the JSON-RPC error
            with pytest.raises(RuntimeError, match="Server at capacity: 1/1 sessions active"):
                b.connect()
        finally:
            b.close()

        async def full() -> None:
            async with connect(ws_of(url)) as ws:
                reply = json.loads(await ws.recv())
                assert reply["data"] == {
                    "message": "Server at capacity: 1/1 sessions active. Cannot accept new connections.",
                    "code": "CAPACITY_REACHED", "active_sessions": 1, "max_sessions": 1,
                }
                with pytest.raises(websockets.ConnectionClosedOK):
                    await ws.recv()

        asyncio.run(full())
        a.close()
        # The slot is freed once the first session's episode is torn down.
        c = MCPToolClient(base_url=url).sync()
        deadline = time.monotonic() + 30
        while True:
            try:
                c.connect()
                assert c.reset(split="eval", index=1).observation.metadata["task"]["index"] == 1
                break
            except (RuntimeError, websockets.ConnectionClosed):
                c.close()
                c = MCPToolClient(base_url=url).sync()
                assert time.monotonic() < deadline
                time.sleep(0.05)
        c.close()


class CountingSandbox(LocalSandbox):
    """The real local sandbox, counting deploys (and optionally slow or failing ones)."""

    def __init__(self, bundle, delay: float = 0.0, fail: bool = False) -> None:
        super().__init__(bundle, workers=4)
        self.deploys, self.delay, self.fail = 0, delay, fail

    async def deploy(self, split: str, index: int) -> EpisodeHandle:
        self.deploys += 1
        if self.fail:
            raise SandboxError("no container for you")
        await asyncio.sleep(self.delay)
        return await super().deploy(split, index)


def test_token():
    sandbox = CountingSandbox(EchoBundle())
    app = build_app(EchoBundle(), token="s3cret", sandbox=sandbox)
    with serve_in_background(app) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/schema").status_code == 401
        assert httpx.get(f"{url}/metadata", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/schema", headers={"Authorization": "s3cret"}).status_code == 401
        assert httpx.get(f"{url}/schema", headers={"Authorization": "Bearer s3cret"}).status_code == 200

        async def play(headers) -> dict:
            async with connect(ws_of(url), additional_headers=headers) as ws:
                return await ask(ws, reset("eval", 0))

        for headers in (None, {"Authorization": "Bearer wrong"}):
            with pytest.raises(websockets.ConnectionClosed) as ei:
                asyncio.run(play(headers))
            assert ei.value.rcvd.code == 1008
        for headers in (None, {"Authorization": "Bearer wrong"}):  # /mcp refuses before a session exists
            with pytest.raises(httpx.HTTPStatusError, match="401"):
                MCPToolClient(base_url=url, headers=headers).sync().connect()
        assert sandbox.deploys == 0 and len(app.state.sessions) == 0
        with MCPToolClient(base_url=url, headers={"Authorization": "Bearer s3cret"}).sync() as env:
            assert env.reset(split="eval", index=0).done is False
        assert sandbox.deploys == 1
        assert asyncio.run(play({"Authorization": "Bearer s3cret"}))["data"]["done"] is False
        assert sandbox.deploys == 2


def test_tool_timeout_ends_the_episode_and_does_not_stall_others(tmp_path):
    app = build_app(EchoBundle(marker_dir=str(tmp_path)), tool_timeout=0.3)
    with serve_in_background(app) as url:

        async def scenario() -> None:
            async with connect(ws_of(url)) as slow, connect(ws_of(url)) as fast:
                await ask(slow, reset("eval", 0))
                await ask(fast, reset("eval", 1))
                slow_call = asyncio.create_task(ask(slow, call("sleep", seconds=1.5)))
                await asyncio.sleep(0.05)
                t0 = time.monotonic()
                for i in range(20):
                    assert (await ask(fast, call("echo", text=str(i))))["data"]["observation"]["result"]["data"] == str(i)
                assert time.monotonic() - t0 < 0.3  # answered while the other episode's tool blocks
                data = (await slow_call)["data"]
                assert data["observation"]["error"]["error_type"] == "timeout"
                assert data["done"] is True and data["reward"] is None
                assert data["metadata"]["failure"] == "tool_timeout"
                # The session is usable: a fresh episode plays to its reward.
                await ask(slow, reset("train", 1))
                data = (await ask(slow, call("end_turn", response="answer-train-1")))["data"]
                assert data["reward"] == 1.0

        asyncio.run(scenario())
        # The timed-out episode is closed once its stuck call returns (never from two threads at once).
        assert wait_until(lambda: any("echo-eval-0" in p.name for p in markers(tmp_path)), 30)


def test_reset_timeout_and_failed_deploy():
    bundle = EchoBundle()
    with serve_in_background(build_app(bundle, sandbox=CountingSandbox(bundle, delay=2), reset_timeout=0.2)) as url:
        with GenericEnvClient(base_url=url).sync() as env:
            r = env.reset(split="eval", index=0)
            assert r.done and r.observation["metadata"]["failure"] == "reset_timeout"
    with serve_in_background(build_app(bundle, sandbox=CountingSandbox(bundle, fail=True))) as url:
        with GenericEnvClient(base_url=url).sync() as env:
            r = env.reset(split="eval", index=0)
            meta = r.observation["metadata"]
            assert r.done and meta["failure"] == "reset_failed" and "no container for you" in meta["error"]


def test_reward_choices():
    def play(app, answer="answer-eval-0"):
        with serve_in_background(app) as url, GenericEnvClient(base_url=url).sync() as env:
            env.reset(split="eval", index=0)
            return env.step({"type": "call_tool", "tool_name": "end_turn", "arguments": {"response": answer}})

    two = EchoBundle(extra_scores=True)
    r = play(build_app(two, reward="length"))
    assert r.reward == float(len("answer-eval-0")) and r.observation["metadata"]["scores"]["match"] == 1.0
    r = play(build_app(two, reward=lambda s: s["match"] * 0.5))
    assert r.reward == 0.5
    r = play(build_app(two))  # two scores and no choice: flagged, no reward
    assert r.reward is None and r.done and r.observation["metadata"]["failure"] == "reward_error"
    with pytest.raises(TypeError):
        build_app(two, reward=3)


def test_multi_turn():
    with serve_in_background(build_app(EchoBundle(turns=2))) as url, GenericEnvClient(base_url=url).sync() as env:
        env.reset(split="eval", index=1)
        r = env.step({"type": "call_tool", "tool_name": "end_turn", "arguments": {"response": "first"}})
        assert not r.done and r.reward is None
        assert r.observation["result"]["prompt"].startswith("Task echo-eval-1")
        assert env.state()["turn"] == 2
        r = env.step({"type": "call_tool", "tool_name": "end_turn", "arguments": {"response": "answer-eval-1"}})
        assert (r.reward, r.done) == (1.0, True)


def test_teardown_on_reset_disconnect_and_shutdown(tmp_path):
    bundle = EchoBundle(marker_dir=str(tmp_path))
    app = build_app(bundle, max_concurrent_envs=4)
    with serve_in_background(app) as url:

        async def scenario() -> None:
            async with connect(ws_of(url)) as ws:
                await ask(ws, reset("eval", 0))
                await ask(ws, reset("eval", 1))  # a reset tears the live episode down first
                assert [p.name.split("-")[2] for p in markers(tmp_path)] == ["eval"]
            # Disconnecting without `close` tears the episode down too.
            assert await asyncio.to_thread(wait_until, lambda: len(markers(tmp_path)) == 2)
            for i in range(3):  # live episodes at shutdown
                ws = await connect(ws_of(url))
                await ask(ws, reset("train", i))

        asyncio.run(scenario())
        assert app.state.served.sandbox.live == 3
    assert len(markers(tmp_path)) == 5 and app.state.served.sandbox.live == 0


def test_build_app_refuses_bad_settings():
    class AllSplit(EchoBundle):
        def splits(self):
            return {"all": 1}

    with pytest.raises(ValueError, match="names a split 'all'"):
        build_app(AllSplit())
    with pytest.raises(ValueError, match="sandbox must be"):
        build_app(EchoBundle(), sandbox="kvm")
    with pytest.raises(ValueError):
        build_app(EchoBundle(), max_concurrent_envs=0)
    with pytest.raises(ValueError):
        build_app(EchoBundle(), token="")
    with pytest.raises(ValueError, match="unknown docker sandbox settings: docker_timout"):
        build_app(EchoBundle(), sandbox={"kind": "docker", "docker_timout": 5})
    # A config object with `kind` works like the string.
    assert isinstance(build_app(EchoBundle(), sandbox={"kind": "local"}).state.served.sandbox, LocalSandbox)
