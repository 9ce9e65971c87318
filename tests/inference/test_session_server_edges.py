"""The session server at its edges (issue 54, "at the servers"; real uvicorn, real tiny models):

* a tool message that answers no call (none before it, or a `tool_call_id` naming no call of the assistant
  message it follows) is a 400 naming `messages[i]`, and nothing is recorded; the conversations the agents send
  (each call's result with its id, an invalid call answered as a tool or a user message) still play;
* a 17 MiB body gets its 413 even from Python's http.client, which sends the whole body before reading; one
  declared past the drain bound is answered at once, without waiting for a body.
"""

from __future__ import annotations

import json

import httpx
import pytest

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.sessions.app import MAX_BODY_BYTES
from agentrl.inference.sessions.server import start_session_server
from agentrl.testing.scripted_phrases import CALL_MUL, J_ADD
from agentrl.testing.stdlib_http import declared_only, oversized_json, stdlib_post
from agentrl.uvicorn_servers import DRAIN_BYTES

HANG = 300.0  # seconds: only to turn a hang into a failure, never a speed check
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}},
         {"type": "function", "function": {"name": "mul", "parameters": {"type": "object", "properties": {}}}}]
USER = {"role": "user", "content": "what is 1 + 2?"}
TWO_CALLS = ("<tool_call>", J_ADD, "</tool_call>", CALL_MUL)


@pytest.fixture(scope="module")
def server(scripted):
    engine = EmbeddedEngine(scripted(*TWO_CALLS), batch_wait_ms=0)
    served = start_session_server(engine, default_max_tokens=64)
    yield served
    served.stop()
    engine.close()


def post(server, sid: str, messages: list[dict]) -> httpx.Response:
    return httpx.post(f"{server.session_url(sid)}/v1/chat/completions", timeout=HANG,
                      json={"messages": messages, "tools": TOOLS})


def call(cid: str | None, name: str = "add") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


ASSISTANT = {"role": "assistant", "content": "", "tool_calls": [call("call_a"), call("call_b", "mul")]}

REFUSED = {  # messages -> the index the 400 must name
    "only a tool message (issue 54's probe)": ([{"role": "tool", "content": "x"}], 0),
    "a tool message after the user's": ([USER, {"role": "tool", "tool_call_id": "call_a", "content": "3"}], 1),
    "after an assistant reply without calls": (
        [USER, {"role": "assistant", "content": "3"}, {"role": "tool", "content": "3"}], 2),
    "an id that names no call": ([USER, ASSISTANT, {"role": "tool", "tool_call_id": "call_z", "content": "3"}], 2),
    "the second result's id names no call": (
        [USER, ASSISTANT, {"role": "tool", "tool_call_id": "call_a", "content": "3"},
         {"role": "tool", "tool_call_id": "call_q", "content": "3"}], 3),
    "a user message in between ends the calls' results": (
        [USER, ASSISTANT, {"role": "tool", "tool_call_id": "call_a", "content": "3"}, USER,
         {"role": "tool", "tool_call_id": "call_b", "content": "3"}], 4),
    "a system message first": ([{"role": "system", "content": "s"}, {"role": "tool", "content": "x"}], 1),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_tool_message_that_answers_no_call_is_a_400_naming_it(server, case):
    messages, index = REFUSED[case]
    sid = server.create_session()
    r = post(server, sid, messages)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.startswith(f"messages[{index}]: "), error
    assert server.records(sid) == []  # refused before the engine ran


ACCEPTED = {
    "each call's result with its id, as the agents send them": [
        USER, ASSISTANT, {"role": "tool", "tool_call_id": "call_a", "name": "add", "content": "3"},
        {"role": "tool", "tool_call_id": "call_b", "name": "mul", "content": "9"}],
    "a result without an id (templates place it by position)": [USER, ASSISTANT, {"role": "tool", "content": "3"}],
    "an empty id (the agent's fallback for a call without one)": [
        USER, ASSISTANT, {"role": "tool", "tool_call_id": "", "content": "3"}],
    "any id answers calls that carry none": [
        USER, {"role": "assistant", "content": "", "tool_calls": [call(None)]},
        {"role": "tool", "tool_call_id": "mine", "content": "3"}],
    "an invalid call answered as a user message": [
        USER, {"role": "assistant", "content": "<tool_call>{bad"}, {"role": "user", "content": "error: ..."}],
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_conversations_that_answer_their_calls_still_play(server, case):
    sid = server.create_session()
    r = post(server, sid, ACCEPTED[case])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_a_session_goes_on_with_its_calls_answered_and_stops_at_a_made_up_id(server):
    sid = server.create_session()
    messages = [USER]
    for _ in range(2):  # the agents' loop: every call answered by its own id
        r = post(server, sid, messages)
        assert r.status_code == 200, r.text
        reply = r.json()["choices"][0]["message"]
        ids = [c["id"] for c in reply["tool_calls"]]
        assert len(ids) == 2 and all(ids)
        messages += [reply, *({"role": "tool", "tool_call_id": i, "content": "3"} for i in ids)]
    bad = messages[:-1] + [{"role": "tool", "tool_call_id": "call_made_up", "content": "3"}]
    r = post(server, sid, bad)
    assert r.status_code == 400 and r.json()["error"].startswith(f"messages[{len(bad) - 1}]: tool_call_id "), r.text
    assert "call_made_up" in r.json()["error"] and ids[0] in r.json()["error"]
    assert len(server.records(sid)) == 2
    assert post(server, sid, messages).status_code == 200  # the session is unharmed


@pytest.mark.parametrize("headers", [{}, {"Connection": "close"}], ids=["keep-alive", "Connection: close"])
def test_a_17_mib_body_gets_its_413_through_http_client(server, headers):
    size = 17 << 20
    assert size > MAX_BODY_BYTES  # the default limit, as a user's server has it
    sid = server.create_session()
    status, reply_headers, body = stdlib_post(server.base_url, f"/sessions/{sid}/v1/chat/completions",
                                              oversized_json(size), headers)
    assert status == 413, body[:300]
    assert reply_headers["content-type"] == "application/json"
    assert f"limit of {MAX_BODY_BYTES} bytes" in json.loads(body)["error"]
    assert server.records(sid) == []
    assert post(server, sid, [USER]).status_code == 200


def test_a_body_declared_past_the_drain_bound_is_answered_without_waiting_for_it(server):
    sid = server.create_session()
    path = f"/sessions/{sid}/v1/chat/completions"
    reply = declared_only(server.base_url, path, MAX_BODY_BYTES + DRAIN_BYTES + 1, timeout=120)  # no body comes
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert b"connection: close" in reply.lower() and b"inference.max_body_bytes" in reply
