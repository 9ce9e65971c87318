"""The session server: OpenAI responses, tool calls, TITO prompts, loss masks, refusals, isolation."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.sessions.app import build_session_app
from agentrl.inference.sessions.samples import assemble_sample
from agentrl.testing.scripted_phrases import BAD_JSON, CALL_MUL, J_ADD

TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {}}}}]
ONE_CALL = ("<tool_call>", J_ADD, "</tool_call>")
TURN_GAP = "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


class Chat:
    """A session over the app, driven the way an agent drives it (echoing replies unchanged)."""

    def __init__(self, client: httpx.AsyncClient, sid: str) -> None:
        self.client, self.sid = client, sid

    async def post(self, messages: list[dict], **kw) -> httpx.Response:
        return await self.client.post(f"/sessions/{self.sid}/v1/chat/completions", json={"messages": messages, **kw})

    async def turn(self, messages: list[dict], **kw) -> dict:
        r = await self.post(messages, **kw)
        assert r.status_code == 200, r.text
        return r.json()


async def open_app(folder, **kw):
    engine = EmbeddedEngine(folder, batch_wait_ms=20)
    app = build_session_app(engine, AutoTokenizer.from_pretrained(folder), **kw)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return engine, client


async def new_chat(client) -> Chat:
    r = await client.post("/sessions")
    return Chat(client, r.json()["session_id"])


@pytest.fixture
async def scripted_client(scripted):
    opened = []

    async def make(*script):
        engine, client = await open_app(scripted(*script))
        opened.append((engine, client))
        return client

    yield make
    for engine, client in opened:
        await client.aclose()
        engine.close()


@pytest.fixture
async def random_client(random_model):
    engine, client = await open_app(random_model, default_max_tokens=8)
    yield engine, client
    await client.aclose()
    engine.close()


USER = [{"role": "user", "content": "what is 1 + 2?"}]


@pytest.mark.parametrize("script,calls,content", [
    (ONE_CALL, [("add", {"a": 1, "b": 2})], ""),
    (ONE_CALL + (CALL_MUL,), [("add", {"a": 1, "b": 2}), ("mul", {"x": 3})], ""),
    (("Let me compute.\n",) + ONE_CALL + (" Done.",), [("add", {"a": 1, "b": 2})], "Let me compute.\n Done."),
])
async def test_tool_calls_parsed(scripted_client, script, calls, content):
    chat = await new_chat(await scripted_client(*script))
    body = await chat.turn(USER, tools=TOOLS)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert got == calls
    assert all(c["type"] == "function" and c["id"] for c in choice["message"]["tool_calls"])
    assert choice["message"]["content"] == content
    usage, meta = body["usage"], choice["meta_info"]
    assert usage["completion_tokens"] == meta["completion_tokens"] == len(meta["output_token_logprobs"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_malformed_tool_call_comes_back_as_content(scripted_client):
    chat = await new_chat(await scripted_client("<tool_call>", BAD_JSON, "</tool_call>"))
    body = await chat.turn(USER, tools=TOOLS)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == "<tool_call>" + BAD_JSON + "</tool_call>"
    assert len(choice["meta_info"]["tool_call_errors"]) == 1


async def three_turns(chat: Chat, **kw) -> list[dict]:
    """user -> reply -> tool result -> reply -> tool result -> reply; returns the final conversation."""
    messages = list(USER)
    for turn in range(3):
        body = await chat.turn(messages, tools=TOOLS, **kw)
        messages.append(body["choices"][0]["message"])
        if turn < 2:
            messages.append(answer(messages[-1], "3"))
    return messages


def answer(reply: dict, text: str) -> dict:
    """The next message after `reply`: its first call's result, or a user message when it made no call (a tool
    message must answer a call)."""
    calls = reply.get("tool_calls")
    return {"role": "tool", "tool_call_id": calls[0]["id"], "content": text} if calls else {"role": "user", "content": text}


async def test_three_turns_masks_and_rerender(scripted_client):
    client = await scripted_client(*ONE_CALL)
    chat = await new_chat(client)
    messages = await three_turns(chat)
    tok = AutoTokenizer.from_pretrained(chat.client._transport.app.state.engine.model_path)
    session = (await client.get(f"/sessions/{chat.sid}")).json()
    records = session["records"]
    assert len(records) == 3
    # each later prompt reuses the previous prompt + the model's tokens verbatim
    for a, b in zip(records, records[1:], strict=False):
        out = [t for _, t in a["response"]["choices"][0]["meta_info"]["output_token_logprobs"]]
        prev = a["request"]["input_ids"] + out
        assert b["request"]["input_ids"][: len(prev)] == prev
        assert b["response"]["choices"][0]["meta_info"]["cached_tokens"] == len(prev)
    sample = assemble_sample(records, reward=1.0, group_id=7)
    assert len(sample.token_ids) == len(sample.loss_mask) == len(sample.rollout_logprobs)
    assert sample.token_ids == session["metadata"]["accumulated_token_ids"]
    reply = "".join(ONE_CALL) + "<|im_end|>"
    spans = [tok.decode(sample.token_ids[s:e]) for s, e in sample.turn_boundaries]
    assert spans == [reply] * 3
    ones = [i for i, m in enumerate(sample.loss_mask) if m]
    assert ones == [i for s, e in sample.turn_boundaries for i in range(s, e)]
    gaps = [tok.decode(sample.token_ids[e:s]) for (_, e), (s, _) in zip(sample.turn_boundaries, sample.turn_boundaries[1:], strict=False)]
    assert gaps == [TURN_GAP, TURN_GAP]
    assert all(lp == 0.0 for lp, m in zip(sample.rollout_logprobs, sample.loss_mask, strict=True) if not m)
    assert (sample.reward, sample.group_id, sample.metadata["finish_reasons"]) == (1.0, 7, ["tool_calls"] * 3)
    # the chat template's render of the final conversation is exactly the tokens' text
    rendered = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert tok.decode(sample.token_ids) + "\n" == rendered
    assert tok.decode(sample.token_ids[: sample.prompt_length]) == tok.apply_chat_template(
        USER, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert session["metadata"]["tito_session_mismatch"] == []


async def test_logprobs_aligned_with_fresh_forward_over_the_sample(random_client, random_model):
    engine, client = random_client
    chat = await new_chat(client)
    await three_turns(chat, temperature=0.8, max_tokens=6)
    sample = assemble_sample((await client.get(f"/sessions/{chat.sid}")).json())
    ref = AutoModelForCausalLM.from_pretrained(random_model).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([sample.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits / 0.8, dim=-1)
    idx = [i for i, m in enumerate(sample.loss_mask) if m]
    assert len(idx) == sum(e - s for s, e in sample.turn_boundaries) and len(sample.turn_boundaries) == 3
    expect = torch.stack([logp[i - 1, sample.token_ids[i]] for i in idx])
    got = torch.tensor([sample.rollout_logprobs[i] for i in idx])
    assert torch.allclose(got, expect, atol=1e-4)


async def test_requests_that_do_not_extend_are_refused(scripted_client):
    chat = await new_chat(await scripted_client(*ONE_CALL))
    body = await chat.turn(USER, tools=TOOLS)
    reply = body["choices"][0]["message"]
    tool = answer(reply, "3")
    edited = dict(reply, tool_calls=[{"id": reply["tool_calls"][0]["id"], "type": "function",
                                      "function": {"name": "add", "arguments": '{"a": 5}'}}])
    cases = [
        ([{"role": "user", "content": "something else"}, reply, tool], "messages\\[0\\]"),
        (USER + [edited, tool], "messages\\[1\\]"),
        (USER + [reply], "adds no message"),
        (USER + [reply, {"role": "assistant", "content": "made up"}], "assistant"),
        (USER, "repeat the whole conversation"),
    ]
    for messages, match in cases:
        r = await chat.post(messages, tools=TOOLS)
        assert r.status_code == 400, (messages, r.text)
        assert re.search(match, r.json()["error"]), r.json()
    r = await chat.post(USER + [reply, tool], tools=None)
    assert r.status_code == 400 and "tools" in r.json()["error"]
    # the session is unharmed: a proper extension still works, with the arguments re-serialised by the client
    echoed = dict(reply, tool_calls=[dict(c, function=dict(c["function"], arguments=json.dumps(
        json.loads(c["function"]["arguments"]), separators=(",", ":")))) for c in reply["tool_calls"]])
    await chat.turn(USER + [echoed, tool], tools=TOOLS)


async def test_bad_bodies_and_unknown_sessions(random_client):
    _, client = random_client
    chat = await new_chat(client)
    for body, status in [
        ({"messages": []}, 400),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400),
        ({"messages": USER, "stream": True}, 400),
        ({"messages": USER, "n": 2}, 400),
        ({"messages": USER, "temperature": "hot"}, 400),
        ({"messages": USER, "max_tokens": 0}, 400),
    ]:
        r = await client.post(f"/sessions/{chat.sid}/v1/chat/completions", json=body)
        assert r.status_code == status and "error" in r.json(), (body, r.text)
    assert (await client.post("/sessions/nope/v1/chat/completions", json={"messages": USER})).status_code == 404
    assert (await client.get("/sessions/nope")).status_code == 404
    assert (await client.delete(f"/sessions/{chat.sid}")).status_code == 204
    assert (await client.delete(f"/sessions/{chat.sid}")).status_code == 404
    assert (await client.get("/health")).json()["status"] == "ok"


async def test_concurrent_sessions_are_isolated(random_client):
    engine, client = random_client
    chats = [await new_chat(client) for _ in range(6)]

    async def run(i: int, chat: Chat):
        messages = [{"role": "user", "content": f"question number {i}"}]
        body = await chat.turn(messages, max_tokens=5 + i, seed=i)
        messages += [body["choices"][0]["message"], {"role": "user", "content": f"follow-up {i}"}]
        await chat.turn(messages, max_tokens=4)
        return messages

    await asyncio.gather(*[run(i, c) for i, c in enumerate(chats)])
    tok = engine.tokenizer
    for i, chat in enumerate(chats):
        records = (await client.get(f"/sessions/{chat.sid}")).json()["records"]
        assert len(records) == 2
        texts = [tok.decode(r["request"]["input_ids"]) for r in records]
        assert f"question number {i}<" in texts[0] and f"follow-up {i}<" in texts[1]
        others = [j for j in range(6) if j != i]
        assert not any(f"number {j}<" in texts[1] or f"follow-up {j}<" in texts[1] for j in others)
        sample = assemble_sample(records)
        assert sum(sample.loss_mask) == sum(len(r["response"]["choices"][0]["meta_info"]["output_token_logprobs"])
                                            for r in records)
    assert engine.stats.max_batch_size > 1  # the sessions really shared batches


async def test_turn_cut_by_length_is_closed_by_scaffolding(scripted_client):
    client = await scripted_client("The answer is 3.")
    chat = await new_chat(client)
    first = await chat.turn(USER, max_tokens=1)  # the whole answer is one token, its <|im_end|> the next
    assert first["choices"][0]["finish_reason"] == "length"
    messages = USER + [first["choices"][0]["message"], {"role": "user", "content": "3"}]  # it made no call
    second = await chat.turn(messages, max_tokens=50)
    assert second["choices"][0]["finish_reason"] == "stop"
    assert second["choices"][0]["message"]["content"] == "The answer is 3."
    sample = assemble_sample((await client.get(f"/sessions/{chat.sid}")).json())
    tok = chat.client._transport.app.state.tokenizer
    (_, end1), (start2, _) = sample.turn_boundaries
    # the model never sampled <|im_end|> in turn 1, so the server adds it, unmasked, before the next message
    assert tok.decode(sample.token_ids[end1:start2]) == "<|im_end|>\n<|im_start|>user\n3<|im_end|>\n<|im_start|>assistant\n"
    assert sample.loss_mask[end1:start2] == [0] * (start2 - end1)
    assert sample.metadata["finish_reasons"] == ["length", "stop"]



@pytest.mark.parametrize("fmt,script", [("llama3", (J_ADD,))])
async def test_the_model_tool_format_picks_the_parser(scripted, fmt, script):
    """model.tool_format reaches the session server: the same reply is a tool call in its format, text in qwen's."""
    folder = scripted(*script)
    for tool_format, expect_call in ((fmt, True), ("qwen", False)):
        engine, client = await open_app(folder, tool_format=tool_format)
        try:
            choice = (await (await new_chat(client)).turn(USER, tools=TOOLS))["choices"][0]
        finally:
            await client.aclose()
            engine.close()
        if expect_call:
            (call,) = choice["message"]["tool_calls"]
            assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("add", {"a": 1, "b": 2})
            assert choice["finish_reason"] == "tool_calls"
        else:
            assert "tool_calls" not in choice["message"] and choice["message"]["content"] == script[0]
