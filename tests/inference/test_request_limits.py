"""No body, prompt or number can crash or stall the session server, and shutdown answers in JSON (issue 26).

Against the real server on a socket, the real tiny models and their real (Rust) tokenizers:
* a 2 MB "abc " message makes the tokenizer panic (a `BaseException`): 400 JSON naming the message;
* `/health` answers while a 2 MB prompt is being tokenized, or a 4 MB body of two million values validated;
* a body over the limit gets 413 JSON, whether it declares its length or is chunked;
* `max_tokens` past the model's context is a 400 naming the field;
* SIGTERM to `python -m agentrl.inference.serve` with generations running answers them 503 JSON.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.sessions.server import start_session_server
from agentrl.models.tiny import ensure_tiny_model
from agentrl.testing.ports import free_port

HANG = 300.0  # seconds: only to turn a hang into a failure, never a speed check
LONG_CONTEXT = 1 << 18  # admits a 2 MB prompt past the length precheck, so the tokenizer really runs on it
TWO_MB = 1 << 21
BODY_LIMIT = 200_000

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model (tokenizer, architecture) made with a 262,144-token context."""
    return ensure_tiny_model(str(tmp_path_factory.mktemp("models") / "tiny-long"), max_position_embeddings=LONG_CONTEXT)


@pytest.fixture(scope="module")
def long_served(long_model):
    engine = EmbeddedEngine(long_model, batch_wait_ms=0)
    server = start_session_server(engine, default_max_tokens=2)
    yield engine, server
    server.stop()
    engine.close()


@pytest.fixture
def short_served(random_model):
    engine = EmbeddedEngine(random_model, batch_wait_ms=0)  # a 1024-token context
    server = start_session_server(engine, default_max_tokens=2, max_body_bytes=BODY_LIMIT)
    yield engine, server
    server.stop()
    engine.close()


def turn(server, content: str, **extra) -> httpx.Response:
    sid = server.create_session()
    return httpx.post(f"{server.session_url(sid)}/v1/chat/completions", timeout=HANG,
                      json={"messages": [{"role": "user", "content": content}], **extra})


def still_serves(server) -> None:
    r = turn(server, "hello")
    assert r.status_code == 200, r.text
    assert httpx.get(f"{server.base_url}/health", timeout=HANG).json()["status"] == "ok"


def test_a_tokenizer_panic_is_a_400_naming_the_message(long_served):
    engine, server = long_served
    r = turn(server, "abc " * 524288)  # 2 MB: the tiny tokenizer's pre-tokenizer regex panics (Rust)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "messages[0]" in error and "tokenizer failed" in error and "PanicException" in error, error
    assert engine.failure is None
    still_serves(server)


def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(short_served):
    engine, server = short_served
    longest = max(len(token) for token in engine.tokenizer.get_vocab())  # the most text one token covers
    r = turn(server, "abc " * (1023 * longest // 4 + 1))  # more characters than 1,023 tokens can cover
    assert r.status_code == 400, r.text
    assert "cannot fit" in r.json()["error"] and "messages[0]" in r.json()["error"], r.text
    r = turn(server, "ab" * 700)  # fits the length precheck, not the context: refused by the real count
    assert r.status_code == 400 and "tokens; the model's context leaves room for 1023" in r.json()["error"], r.text
    still_serves(server)


def _running(*names: str) -> bool:
    """Whether some thread of this process is inside one of agentrl's functions `names` right now."""
    for frame in sys._current_frames().values():
        while frame is not None:
            code = frame.f_code
            if code.co_name in names and "agentrl" in code.co_filename:
                return True
            frame = frame.f_back
    return False


def health_while(server, busy: tuple[str, ...], send) -> httpx.Response:
    """Send a big request with `send()` on a thread; once the server is inside `busy`, /health must answer
    while the server is still inside it (seconds of work). Returns the big request's response."""
    big: dict[str, httpx.Response] = {}
    sender = threading.Thread(target=lambda: big.setdefault("r", send()), daemon=True)
    sender.start()
    deadline = time.monotonic() + HANG
    while not _running(*busy):
        assert sender.is_alive() and time.monotonic() < deadline, f"the server never ran {busy}"
        time.sleep(0.005)
    health = httpx.get(f"{server.base_url}/health", timeout=HANG)
    assert _running(*busy), f"/health waited for the big request's {busy} to end"
    assert health.status_code == 200 and health.json()["status"] == "ok"
    sender.join(HANG)
    return big["r"]


def test_health_answers_while_a_2mb_prompt_is_tokenized(long_served):
    _, server = long_served
    rng = random.Random(0)
    digits = "".join(rng.choice("0123456789 ") for _ in range(TWO_MB))  # seconds of tokenizing, no panic
    r = health_while(server, ("encode", "encode_ids"), lambda: turn(server, digits))
    assert r.status_code == 400 and "tokens; the model's context" in r.json()["error"], r.text


def test_health_answers_while_a_4mb_body_of_two_million_values_is_validated(long_served):
    _, server = long_served
    values = "[" + ",".join(["0"] * TWO_MB) + "]"  # seconds of checking that every value is finite
    raw = '{"messages": [{"role": "user", "content": "hi"}], "x": ' + values + "}"
    sid = server.create_session()
    r = health_while(server, ("check_tree",), lambda: httpx.post(
        f"{server.session_url(sid)}/v1/chat/completions", content=raw, headers={"content-type": "application/json"},
        timeout=HANG))
    assert r.status_code == 200, r.text[:300]  # an unknown key of finite numbers is kept, as before


def test_a_body_over_the_limit_is_413_json(short_served):
    _, server = short_served
    sid = server.create_session()
    url = f"{server.session_url(sid)}/v1/chat/completions"
    declared = httpx.post(url, json={"messages": [{"role": "user", "content": "x" * BODY_LIMIT}]}, timeout=HANG)

    def chunks():  # no Content-Length: the limit must hold while the body streams in
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(25):
            yield b"x" * 10_000
        yield b'"}]}'

    chunked = httpx.post(url, content=chunks(), headers={"content-type": "application/json"}, timeout=HANG)
    for r in (declared, chunked):
        assert r.status_code == 413, r.text
        assert r.headers["content-type"] == "application/json"
        assert f"limit of {BODY_LIMIT} bytes" in r.json()["error"], r.text
    assert server.records(sid) == []
    still_serves(server)


def test_max_tokens_past_the_context_is_a_400_naming_it(short_served):
    _, server = short_served
    for field in ("max_tokens", "max_completion_tokens"):
        for value in (10**12, 1025):
            r = turn(server, "hi", **{field: value})
            assert r.status_code == 400 and field in r.json()["error"] and "1024" in r.json()["error"], r.text
    r = turn(server, "hi", max_tokens=1024, temperature=0)  # the context itself is allowed; the engine clamps it
    assert r.status_code == 200, r.text
    openapi = httpx.get(f"{server.base_url}/openapi.json", timeout=HANG).json()
    body = openapi["paths"]["/sessions/{session_id}/v1/chat/completions"]["post"]["requestBody"]
    assert "'maximum': 1024" in str(body["content"]["application/json"]["schema"]["properties"]["max_tokens"])


# ---------------------------------------------------------------- SIGTERM to the serve CLI


async def test_sigterm_answers_generations_in_flight_with_json_503(long_model, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # the tiny model with a long context, so a generation of 100,000 tokens is in flight on any machine
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.inference.serve", "model=hf", f"model.path={long_model}",
                             f"port={port}", "log_level=warning"], cwd=tmp_path,
                            env=dict(os.environ, AGENTRL_HOME=str(tmp_path / "home")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=HANG) as client:
            deadline = time.monotonic() + HANG
            while True:
                assert proc.poll() is None, proc.stdout.read()
                try:
                    if (await client.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "serve did not come up"
                await asyncio.sleep(0.2)

            async def long_generation() -> httpx.Response:
                sid = (await client.post("/sessions")).json()["session_id"]
                return await client.post(f"/sessions/{sid}/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "count"}], "max_tokens": 100_000, "ignore_eos": True})

            running = [asyncio.ensure_future(long_generation()) for _ in range(4)]
            while (await client.get("/health")).json()["sessions"] < len(running):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # let them reach the engine
            assert not any(task.done() for task in running)
            proc.send_signal(signal.SIGTERM)
            replies = await asyncio.wait_for(asyncio.gather(*running), HANG)
        for r in replies:
            assert r.status_code == 503, (r.status_code, r.headers.get("content-type"), r.text)
            assert r.headers["content-type"] == "application/json"
            assert "shutting down" in r.json()["error"], r.text
        assert proc.wait(HANG) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(HANG)
