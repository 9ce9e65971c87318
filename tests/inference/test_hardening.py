"""No request can kill the session server's engine; a dead or wedged engine cannot hang the server.

Against the real server on a socket and the real (tiny, random) model: hostile bodies answer 400
naming the field and the engine keeps serving; a worker that dies fails every pending request with
503 at once and `/health` says so; `python -m agentrl.inference.serve` exits non-zero when its engine
dies and ends within seconds of SIGTERM even with the engine wedged. Faults are injected with
`faults.FaultyEngine` (the real engine, broken on cue) or with real NaN weights.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from faults import CRASH_WORKER, INJECTED, WEDGE_LOOP, WEDGE_WORKER

from agentrl.agents.chat import chat
from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.serve import EXIT_ENGINE_DIED, SHUTDOWN_DEADLINE_S
from agentrl.inference.sessions.app import build_session_app
from agentrl.inference.sessions.server import start_session_server
from agentrl.testing.ports import free_port
from agentrl.uvicorn_servers import serve_in_background

HERE = Path(__file__).resolve().parent
USER = [{"role": "user", "content": "hello"}]
HANG = 120.0  # seconds: only to turn a hang into a failure, never a speed check

pytestmark = pytest.mark.slow


@pytest.fixture
def served(random_model):
    engine = EmbeddedEngine(random_model)
    server = start_session_server(engine, default_max_tokens=4)
    yield engine, server
    server.stop()
    engine.close()


def post_raw(base: str, sid: str, raw: str) -> httpx.Response:
    return httpx.post(f"{base}/sessions/{sid}/v1/chat/completions", content=raw,
                      headers={"content-type": "application/json"}, timeout=HANG)


def healthy_turn(base: str) -> None:
    """A fresh session still gets a completion, and /health says ok."""
    sid = httpx.post(f"{base}/sessions", timeout=HANG).json()["session_id"]
    r = httpx.post(f"{base}/sessions/{sid}/v1/chat/completions", json={"messages": USER, "temperature": 0.7},
                   timeout=HANG)
    assert r.status_code == 200, r.text
    assert httpx.get(f"{base}/health", timeout=HANG).json()["status"] == "ok"




def body(rest: str) -> str:
    """A raw JSON body: a valid user message, then `rest` (JSON members, possibly hostile)."""
    return '{"messages": [{"role": "user", "content": "hi"}], ' + rest + "}"


HOSTILE = [  # (raw JSON body, the field the 400 must name)
    (body('"temperature": NaN'), "temperature"),  # the request that killed the engine in issue 15
    (body('"temperature": Infinity'), "temperature"),
    (body('"temperature": -0.5'), "temperature"),
    (body('"temperature": "hot"'), "temperature"),
    (body('"max_tokens": 1e400'), "max_tokens"),
    (body('"max_tokens": NaN'), "max_tokens"),
    (body('"max_tokens": 1.5'), "max_tokens"),
    (body('"max_tokens": 0'), "max_tokens"),
    (body('"max_tokens": true'), "max_tokens"),
    (body('"max_tokens": 1000000000000'), "max_tokens"),  # past the model's 1,024-token context: refused, not clamped
    (body('"max_completion_tokens": 1025'), "max_completion_tokens"),
    (body('"max_completion_tokens": -3'), "max_completion_tokens"),
    (body('"top_p": 0'), "top_p"),
    (body('"top_p": 1.5'), "top_p"),
    (body('"top_p": -Infinity'), "top_p"),
    (body('"top_k": 2.5'), "top_k"),
    (body('"top_k": -7'), "top_k"),
    (body('"top_k": 1000000000000000000000000000000'), "top_k"),
    (body('"seed": "abc"'), "seed"),
    (body('"seed": 1e30'), "seed"),
    (body('"seed": 100000000000000000000000000000'), "seed"),
    (body('"stop_token_ids": [1.5]'), "stop_token_ids[0]"),
    (body('"stop_token_ids": 3'), "stop_token_ids"),
    (body('"stop_token_ids": [4294967296]'), "stop_token_ids[0]"),
    (body('"stop_token_ids": [' + ", ".join(["1"] * 1025) + "]"), "stop_token_ids"),
    (body('"ignore_eos": "yes"'), "ignore_eos"),
    (body('"chat_template_kwargs": [1]'), "chat_template_kwargs"),
    (body('"logprobs": NaN'), "logprobs"),  # unknown keys are kept, so they must be finite too
    (body('"extra": {"deep": [1, 2, Infinity]}'), "extra.deep[2]"),
    (body('"n": 3'), "n=1"),
    (body('"stream": true'), "stream"),
    ('{"messages": []}', "messages"),
    ('{"messages": "hi"}', "messages"),
    ('{"messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role"),
    ('{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages[0].content"),
    ('{"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}', "messages[0].tool_calls[0].function.name"),
    (body('"tools": {"name": "add"}'), "tools"),
    (body('"tools": [{"type": "function", "function": {"name": 3}}]'), "tools[0].function.name"),
    (body('"x": ' + "[" * 5000 + "]" * 5000), "nests deeper"),  # past the JSON parser's recursion limit
    (body('"x": ' + "[" * 200 + "]" * 200), "nested deeper"),
    ("[1, 2]", "body"),
    ("null", "body"),
    ("", "body"),
    ('{"messages": [', "JSON"),
    ("\x00\xff garbage", "JSON"),
]


def test_hostile_bodies_answer_400_naming_the_field_and_the_engine_lives(served):
    engine, server = served
    base = server.base_url
    sid = server.create_session()
    for raw, field in HOSTILE:
        r = post_raw(base, sid, raw)
        assert r.status_code == 400, (raw[:80], r.status_code, r.text)
        assert field in r.json()["error"], (raw[:80], r.json())
    assert server.records(sid) == []  # nothing refused was recorded
    healthy_turn(base)
    # values at the edge of the ranges, which used to reach sampling as inf or NaN, are served
    for extra in ({"temperature": 1e-300}, {"top_p": 1e-300, "temperature": 1.0}, {"temperature": 1e300},
                  {"top_k": 2**31 - 1}, {"max_tokens": 1024}, {"seed": 2**64 - 1}, {"seed": -(2**63)}):
        s = server.create_session()
        r = httpx.post(f"{server.session_url(s)}/v1/chat/completions", json={"messages": USER, **extra}, timeout=HANG)
        assert r.status_code == 200, (extra, r.text)
    assert engine.failure is None
    healthy_turn(base)


async def test_every_field_the_clients_send_still_works(served):
    """Miles' request kwargs, the GRPO trainer's and the OpenAI SDK's extras, through the agents' own `chat`."""
    _, server = served
    miles = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "skip_special_tokens": False, "no_stop_trim": True,
             "max_tokens": 3}  # measured from Miles 0.0.2 (reference/miles.md section 1)
    grpo = {"temperature": 0.9, "top_p": 0.95, "top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
    openai = {"model": "m", "max_completion_tokens": 3, "seed": 7, "n": 1, "stream": False, "logprobs": True,
              "tool_choice": "auto", "parallel_tool_calls": True, "stop": None, "stop_token_ids": [0]}
    tools = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                               "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
    async with httpx.AsyncClient() as client:
        for kwargs in (miles, grpo, openai):
            sid = server.create_session()
            messages = [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}, *USER]
            reply = await chat(client, server.session_url(sid), messages, tools=tools, request_kwargs=kwargs,
                               max_tokens=4, timeout=HANG)
            calls = reply.message.get("tool_calls")  # a tool message must answer a call the reply made
            messages += [reply.message, {"role": "tool", "tool_call_id": calls[0]["id"], "name": "add", "content": "3"}
                         if calls else {"role": "user", "content": "3"}]
            await chat(client, server.session_url(sid), messages, tools=tools, request_kwargs=kwargs, timeout=HANG)
            records = server.records(sid)
            assert len(records) == 2
            assert {k: records[0]["request"][k] for k in kwargs} == kwargs  # recorded as sent


async def test_dead_worker_fails_every_pending_request_with_503(served):
    """NaN weights make sampling raise in the worker: all waiting requests get 503 at once, nothing hangs."""
    engine, server = served
    base = server.base_url
    healthy_turn(base)
    engine.update_weights({"model.norm.weight": torch.full_like(engine.model.model.norm.weight, float("nan"))})
    sids = [server.create_session() for _ in range(4)]
    async with httpx.AsyncClient(base_url=base, timeout=HANG) as client:
        async def turn(sid: str) -> httpx.Response:
            return await client.post(f"/sessions/{sid}/v1/chat/completions",
                                     json={"messages": USER, "temperature": 1.0, "max_tokens": 50})

        # two turns on one session: the second waits on the session's lock while the first dies
        replies = await asyncio.wait_for(asyncio.gather(*(turn(s) for s in sids + sids[:1])), HANG)
        for r in replies:
            assert r.status_code == 503, r.text
            assert "worker died" in r.json()["error"] and "probability tensor" in r.json()["error"], r.text
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert "probability tensor" in health.json()["error"]
        later = await turn(sids[1])  # a request after the death is refused at once, not queued
        assert later.status_code == 503 and "worker died" in later.json()["error"]
        assert (await client.delete(f"/sessions/{sids[0]}")).status_code == 204  # no lock left held
    assert engine.stopped.wait(HANG)


def test_oversized_body_is_refused_before_it_is_read(random_model):
    engine = EmbeddedEngine(random_model)
    try:
        with serve_in_background(build_session_app(engine, default_max_tokens=2, max_body_bytes=2000)) as base:
            sid = httpx.post(f"{base}/sessions", timeout=HANG).json()["session_id"]
            big = {"messages": [{"role": "user", "content": "x" * 5000}]}
            r = httpx.post(f"{base}/sessions/{sid}/v1/chat/completions", json=big, timeout=HANG)
            assert r.status_code == 413 and "limit of 2000 bytes" in r.json()["error"], r.text
            healthy_turn(base)
    finally:
        engine.close()


# ---------------------------------------------------------------- the serve CLI as a real process


class Served:
    """`python -m agentrl.inference.serve` over `model` with `faults.FaultyEngine`, in its own process."""

    def __init__(self, model: Path, cwd: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, AGENTRL_HOME=str(cwd / "home"),
                   PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentrl.inference.serve", "model=hf", f"model.path={model}",
             "inference._target_=faults.FaultyEngine", f"port={self.port}", "default_max_tokens=4",
             "log_level=warning"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + HANG
        while True:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(f"{self.base}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.2)

    def output(self) -> str:
        return self.proc.stdout.read() if self.proc.stdout else ""

    def session(self) -> str:
        return httpx.post(f"{self.base}/sessions", timeout=HANG).json()["session_id"]

    async def turn(self, client: httpx.AsyncClient, sid: str, text: str) -> httpx.Response | Exception:
        try:
            return await client.post(f"{self.base}/sessions/{sid}/v1/chat/completions",
                                     json={"messages": [{"role": "user", "content": text}]})
        except httpx.HTTPError as exc:
            return exc

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(HANG)


@pytest.fixture
def serve_cli(random_model, tmp_path):
    made: list[Served] = []

    def start() -> Served:
        made.append(Served(random_model, tmp_path))
        return made[-1]

    yield start
    for s in made:
        s.close()


async def test_serve_exits_nonzero_when_its_engine_dies(serve_cli):
    srv = serve_cli()
    crash, one, two = srv.session(), srv.session(), srv.session()
    async with httpx.AsyncClient(timeout=HANG) as client:
        first = asyncio.ensure_future(srv.turn(client, crash, f"please {CRASH_WORKER}"))
        await asyncio.sleep(0.5)  # the worker holds the crash request until two more are queued
        # two queued in the engine, and one waiting on the crash session's lock
        rest = [srv.turn(client, one, "queued one"), srv.turn(client, two, "queued two"),
                srv.turn(client, crash, "behind the lock")]
        replies = await asyncio.wait_for(asyncio.gather(first, *rest), HANG)
    for r in replies:
        assert isinstance(r, httpx.Response) and r.status_code == 503, r
        assert INJECTED in r.json()["error"], r.text
    assert srv.proc.wait(HANG) == EXIT_ENGINE_DIED, srv.output()


@pytest.mark.parametrize("trigger", [WEDGE_WORKER, WEDGE_LOOP])
async def test_sigterm_ends_serve_within_its_deadline_even_when_wedged(serve_cli, trigger):
    srv = serve_cli()
    sid = srv.session()
    async with httpx.AsyncClient(timeout=HANG) as client:
        stuck = asyncio.ensure_future(srv.turn(client, sid, f"now {trigger}"))
        await asyncio.sleep(1.0)  # let it reach the engine
        assert not stuck.done()
        srv.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        code = await asyncio.to_thread(srv.proc.wait, HANG)
        took = time.monotonic() - start
        reply = await asyncio.wait_for(stuck, HANG)  # the client is answered or disconnected, not left hanging
    assert code != 0
    if trigger == WEDGE_WORKER:  # the event loop is free: the turn is answered as the API says
        assert isinstance(reply, httpx.Response) and reply.status_code == 503, reply
        assert "shutting down" in reply.json()["error"], reply.text
    # the deadline is SHUTDOWN_DEADLINE_S; the bound here is only generous enough for a loaded box
    assert took < SHUTDOWN_DEADLINE_S + 60, took


def test_records_are_json_after_hostile_extras(served):
    """A recorded body is sent back by GET /sessions/{id}: unknown keys must not break that JSON."""
    _, server = served
    sid = server.create_session()
    body = {"messages": USER, "metadata": {"a": [1, 2.5, None, {"b": "c"}]}, "user": "u1"}
    r = httpx.post(f"{server.session_url(sid)}/v1/chat/completions", json=body, timeout=HANG)
    assert r.status_code == 200, r.text
    remote = httpx.get(f"{server.base_url}/sessions/{sid}", timeout=HANG)
    assert remote.status_code == 200
    assert json.loads(remote.text)["records"][0]["request"]["metadata"] == body["metadata"]
