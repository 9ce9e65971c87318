"""Bounded property-based fuzzing of the env server, on a real socket (echo test bundle, local sandbox).

Each fuzzer has a fixed seed and example budget (well under two minutes in all on a loaded 2-core box):

* schemathesis generates requests for every operation of the app's own OpenAPI schema, with and without
  the bearer token configured;
* hypothesis builds WebSocket frames by hand: every message type with hostile values in every field (JSON
  `NaN`, `Infinity`, `1e400`, 4,300- and 5,000-digit integers, fractions, wrong types), deep nesting (up to
  5,000 levels) anywhere in a frame, and plain garbage text and bytes; and well-formed `mcp` and `step` frames
  with a non-finite number as the JSON-RPC id or inside the tool arguments, which must all be refused as invalid
  JSON before any tool runs (strict JSON both ways).

Pass: no HTTP answer is a 5xx and none takes past `HANG` (only a hang detector); every frame gets one
well-formed reply, strict JSON (no `NaN` or `Infinity` echoed back; or, for `close`, a clean close), and the session lives on after it (it still answers
`state`); after every case a well-behaved client still plays an episode to its reward and `/health` says
healthy; at the end no session is left holding a slot.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import ClientConnection, connect

from agentrl.envs.client import EpisodeClient
from agentrl.envs.server import build_app, serve_in_background
from agentrl.envs.server.echo import EchoBundle
from agentrl.envs.server.wire import MAX_DEPTH
from agentrl.testing.wait import wait_until

HANG = 60.0  # seconds for one reply: only a hang detector
SEED = 15  # issue 15
BUDGET = {"schema": 10, "frames": 150, "deep": 30, "garbage": 40, "non_finite": 60}
REPLY_TYPES = {"error", "observation", "state", "mcp"}
ERROR_CODES = {"INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "EXECUTION_ERROR", "CAPACITY_REACHED"}

pytestmark = pytest.mark.slow


def budget(n: int) -> settings:
    # fixed seed, no example database, no shrinking: the same cases in CI every time, bounded work
    return settings(max_examples=n, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck), derandomize=False)


@pytest.fixture(scope="module")
def live():
    # A tool timeout well above the fuzzer's largest sleep (0.05 s): hostile sleeps fail fast in the tool itself.
    app = build_app(EchoBundle(), max_concurrent_envs=4, tool_timeout=5)
    with serve_in_background(app) as url:
        yield app, url
    assert not app.state.served.sessions


def ws_of(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


def still_serves(url: str) -> None:
    """A well-behaved client plays an episode to its reward; /health says healthy."""

    async def play() -> float | None:
        async with EpisodeClient(url, reset_timeout=HANG, tool_timeout=HANG) as env:
            await env.reset("eval", 1)
            assert (await env.call("echo", {"text": "still there?"})).text == "still there?"
            return (await env.end_turn("answer-eval-1")).reward

    assert asyncio.run(play()) == 1.0
    health = httpx.get(f"{url}/health", timeout=HANG, trust_env=False)
    assert health.status_code == 200 and health.json()["status"] == "healthy", health.text


def not_json(constant: str) -> None:
    raise AssertionError(f"the reply holds {constant}, which is not JSON")


def ask(ws: ClientConnection, frame: str | bytes) -> dict[str, Any] | None:
    """Send one frame; its one reply (checked for shape), or None when the server closed cleanly (`close`)."""
    ws.send(frame)
    try:
        raw = ws.recv(timeout=HANG)
    except ConnectionClosedOK:
        return None
    reply = json.loads(raw, parse_constant=not_json)  # strict JSON: a client in any language must parse it
    assert isinstance(reply, dict) and reply.get("type") in REPLY_TYPES and "data" in reply, raw[:300]
    if reply["type"] == "error":
        assert reply["data"]["code"] in ERROR_CODES and isinstance(reply["data"]["message"], str), raw[:300]
    return reply


def play_frames(url: str, frames: list[str | bytes], live_episode: bool,
                refused: Callable[[str | bytes], bool] = lambda frame: False) -> None:
    """Send `frames` on one connection (after a reset when `live_episode`); the session must live on. A frame for
    which `refused` holds must get an INVALID_JSON error."""
    with connect(ws_of(url), open_timeout=HANG, max_size=None) as ws:
        if live_episode:
            assert ask(ws, json.dumps({"type": "reset", "data": {"split": "eval", "index": 0}}))["type"] == "observation"
        for frame in frames:
            reply = ask(ws, frame)
            if refused(frame):
                assert reply is not None and reply["type"] == "error", (frame[:200], reply)
                assert reply["data"]["code"] == "INVALID_JSON", (frame[:200], reply)
            if reply is None:
                return  # a `close` frame: the server ended the session as asked
        reply = ask(ws, '{"type": "state"}')
        assert reply is not None and reply["type"] == "state", reply


# ---------------------------------------------------------------- schemathesis over the OpenAPI schema


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_schemathesis_finds_no_server_error(token):
    app = build_app(EchoBundle(), max_concurrent_envs=4, token=token)
    with serve_in_background(app) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers={"Authorization": f"Bearer {token}"})
        operations = [result.ok() for result in schema.get_all_operations()]
        # /mcp: OpenEnv 0.10's JSON-RPC over HTTP, fuzzed here with whatever bodies its schema admits
        assert {op.path for op in operations} == {"/health", "/schema", "/metadata", "/mcp"}
        for op in operations:
            fuzz_operation(op, url, token)


def fuzz_operation(op: Any, url: str, token: str | None) -> None:
    """Run `BUDGET["schema"]` schemathesis cases of one operation, with and without the token when one is set."""

    @seed(SEED)
    @budget(BUDGET["schema"])
    @given(case=op.as_strategy(), authorized=st.booleans())
    def fuzz(case: Any, authorized: bool) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token and authorized else {}
        r = case.call(base_url=url, timeout=HANG, headers=headers)
        assert r.status_code < 500, f"{op.method.upper()} {op.path} -> {r.status_code} {r.text[:300]}"
        if token and not authorized and op.path != "/health":
            assert r.status_code == 401
        still_serves_with(url, token)

    fuzz()


def still_serves_with(url: str, token: str | None) -> None:
    if token is None:
        still_serves(url)
        return
    r = httpx.get(f"{url}/metadata", headers={"Authorization": f"Bearer {token}"}, timeout=HANG, trust_env=False)
    assert r.status_code == 200 and r.json()["name"] == "echo"


# ---------------------------------------------------------------- hand-made hostile frames

RAW_NUMBERS = ["NaN", "-NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "0.05", "0.0", "-1", "0",
               "1" * 4300, "1" * 5000, "-" + "9" * 400, "1e308", "4.9e-324", "true", "false", "null", '"1"',
               '""', "[]", "{}", "2" + "0" * 20]
TOOL_NAMES = ["echo", "sleep", "finish", "end_turn", "list_tools", "reset", "state", "", "ECHO", "é" * 3, "x" * 300]
ARGUMENT_KEYS = ["text", "seconds", "answer", "response", "extra", ""]

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                          max_leaves=12)
nesting = st.integers(1, 3000).flatmap(lambda d: st.sampled_from(["[" * d + "]" * d, '{"a":' * d + "1" + "}" * d]))
raw_value = st.one_of(st.sampled_from(RAW_NUMBERS), json_value.map(lambda v: json.dumps(v, allow_nan=True)), nesting)


def raw_of(values: list[str]) -> st.SearchStrategy[str]:
    """Mostly a meaningful value (as JSON text), else any hostile one."""
    return st.one_of(st.sampled_from([json.dumps(v) for v in values]), raw_value)


@st.composite
def raw_object(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[str]]) -> str:
    """A JSON object text with any subset of `fields` (in any order), or now and then not an object at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(raw_value)
    keys = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields))) if fields else []
    members = [f"{json.dumps(k)}: {draw(fields[k])}" for k in keys]
    return "{" + ", ".join(draw(st.permutations(members))) + "}"


arguments = raw_object({k: raw_value for k in ARGUMENT_KEYS})
actions = {
    "step": raw_object({"type": raw_of(["call_tool", "list_tools", "nope"]), "tool_name": raw_of(TOOL_NAMES),
                        "arguments": arguments, "metadata": raw_object({"x": raw_value})}),
    "reset": raw_object({"split": raw_of(["train", "eval", "all", "dev"]), "index": raw_of([0, 1, 4, -1, 99]),
                         "seed": raw_value, "episode_id": raw_value}),
    "mcp": raw_object({"jsonrpc": raw_of(["2.0", "1.0"]), "id": raw_value,
                       "method": raw_of(["tools/list", "tools/call", "x/y"]),
                       "params": raw_object({"name": raw_of(TOOL_NAMES), "arguments": arguments})}),
    "state": raw_object({}),
    "close": raw_object({}),
}


@st.composite
def frame(draw: st.DrawFn) -> str:
    """A frame of any message type (or a hostile `type`), its `data` hostile in every field, now and then
    with an extra member."""
    kind = draw(st.sampled_from([*actions, "other"]))
    members = {"type": draw(raw_of([kind])) if kind != "other" else draw(raw_value)}
    if kind != "other" and draw(st.integers(0, 4)) > 0:
        members["data"] = draw(actions[kind])
    elif draw(st.booleans()):
        members["data"] = draw(raw_value)
    if draw(st.integers(0, 9)) == 0:
        members["extra"] = draw(raw_value)
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in members.items()) + "}"


def test_hostile_frames_never_break_the_server(live):
    app, url = live

    @seed(SEED)
    @budget(BUDGET["frames"])
    @given(frames=st.lists(frame(), min_size=1, max_size=3), live_episode=st.booleans())
    def fuzz(frames: list[str], live_episode: bool) -> None:
        play_frames(url, frames, live_episode)
        still_serves(url)

    fuzz()
    assert wait_until(lambda: not app.state.served.sessions), "a session still holds a slot"


@st.composite
def deep_frame(draw: st.DrawFn) -> str:
    """A small, valid-looking frame with one value nested `depth` deep somewhere in it."""
    deep = draw(nesting)
    where = draw(st.sampled_from(["top", "arguments", "reset", "mcp", "metadata"]))
    return {
        "top": deep,
        "arguments": '{"type": "step", "data": {"tool_name": "echo", "arguments": {"text": ' + deep + "}}}",
        "reset": '{"type": "reset", "data": {"split": ' + deep + ', "index": 0}}',
        "mcp": '{"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
               '{"name": "echo", "arguments": {"text": ' + deep + "}}}}",
        "metadata": '{"type": "step", "data": {"tool_name": "echo", "arguments": {}, "metadata": {"m": '
                    + deep + "}}}",
    }[where]


def depth_of(frame: str | bytes) -> int:
    """How deep `frame`'s arrays and objects nest (brackets inside strings not counted), without parsing it:
    Python's JSON codecs recurse and cannot read a frame nested thousands deep."""
    text = frame.decode() if isinstance(frame, bytes) else frame
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def test_depth_of_counts_brackets_outside_strings():
    assert depth_of('{"a": [[1], {"b": "[[[{"}]}') == 3 and depth_of("[]") == 1 and depth_of('"[["') == 0
    assert depth_of('{"a": "\\"[", "b": [1]}') == 2  # an escaped quote does not end the string


def test_deep_nesting_anywhere_gets_an_error_and_the_session_lives_on(live):
    app, url = live

    @seed(SEED)
    @budget(BUDGET["deep"])
    @given(frames=st.lists(deep_frame(), min_size=1, max_size=3), live_episode=st.booleans())
    def fuzz(frames: list[str], live_episode: bool) -> None:
        # Past MAX_DEPTH a frame is refused as invalid JSON wherever the depth is; a shallower one gets whatever
        # well-formed reply its content earns (checked by `ask`).
        play_frames(url, frames, live_episode, refused=lambda frame: depth_of(frame) > MAX_DEPTH)
        still_serves(url)

    fuzz()
    assert wait_until(lambda: not app.state.served.sessions), "a session still holds a slot"


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E999", "-0.5e99999"]


@st.composite
def non_finite_frame(draw: st.DrawFn) -> str:
    """A well-formed `mcp` or `step` frame with a non-finite number where the JSON-RPC id or a tool argument
    goes (at any depth inside the arguments)."""
    bad = draw(st.sampled_from(NON_FINITE))
    depth = draw(st.integers(0, 4))
    value = "[" * depth + bad + "]" * depth
    tool = draw(st.sampled_from(["echo", "sleep", "finish", "end_turn", "nope"]))
    key = draw(st.sampled_from(ARGUMENT_KEYS))
    arguments = "{" + json.dumps(key) + ": " + value + "}"
    method = draw(st.sampled_from(["tools/call", "tools/list", "x/y"]))
    rid = value if draw(st.booleans()) else draw(st.sampled_from(["1", '"a"', "null"]))
    return draw(st.sampled_from([
        '{"type": "mcp", "data": {"jsonrpc": "2.0", "id": ' + rid + ', "method": "' + method
        + '", "params": {"name": "' + tool + '", "arguments": ' + arguments + "}}}",
        '{"type": "mcp", "data": {"jsonrpc": "2.0", "id": ' + value + ', "method": "' + method + '"}}',
        '{"type": "step", "data": {"type": "call_tool", "tool_name": "' + tool + '", "arguments": ' + arguments
        + "}}",
        '{"type": "step", "data": {"tool_name": "' + tool + '", "arguments": ' + arguments + "}}",
    ]))


def test_non_finite_numbers_in_mcp_frames_and_tool_arguments_are_refused(live):
    """Each such frame gets a strict-JSON INVALID_JSON error (never an echoed `NaN` id) and reaches no tool:
    the episode's step count is unchanged and the episode still plays to its reward."""
    app, url = live

    @seed(SEED)
    @budget(BUDGET["non_finite"])
    @given(frames=st.lists(non_finite_frame(), min_size=1, max_size=4))
    def fuzz(frames: list[str]) -> None:
        with connect(ws_of(url), open_timeout=HANG, max_size=None) as ws:
            assert ask(ws, json.dumps({"type": "reset", "data": {"split": "eval", "index": 1}}))["type"] == "observation"
            for frame in frames:
                reply = ask(ws, frame)
                assert reply is not None and reply["type"] == "error", (frame, reply)
                assert reply["data"]["code"] == "INVALID_JSON", (frame, reply)
            state = ask(ws, '{"type": "state"}')
            assert state["data"]["step_count"] == 0 and not state["data"]["done"], (frames, state)
            end = {"type": "step", "data": {"tool_name": "end_turn", "arguments": {"response": "answer-eval-1"}}}
            assert ask(ws, json.dumps(end))["data"]["reward"] == 1.0

    fuzz()
    assert wait_until(lambda: not app.state.served.sessions), "a session still holds a slot"


def test_garbage_frames_never_break_the_server(live):
    app, url = live

    @seed(SEED)
    @budget(BUDGET["garbage"])
    @given(frames=st.lists(st.one_of(st.binary(max_size=300), st.text(max_size=300)), min_size=1, max_size=3))
    def fuzz(frames: list[str | bytes]) -> None:
        play_frames(url, frames, live_episode=True)
        still_serves(url)

    fuzz()
    assert wait_until(lambda: not app.state.served.sessions), "a session still holds a slot"
