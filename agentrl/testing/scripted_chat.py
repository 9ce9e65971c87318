"""A tiny OpenAI-compatible chat server that replays scripted replies, with the Miles session-server routes.

Tests of agent code run against it over real HTTP, so what an agent sends and how it reacts to each reply
(tool calls, malformed arguments, a slow model) is exact. Routes:

    GET  /health
    POST /v1/chat/completions                    (no session)
    POST /sessions                               -> {"session_id": ...}
    POST /sessions/{id}/v1/chat/completions      (recorded)
    GET  /sessions/{id}                          -> {"session_id", "records", "metadata"}
    DELETE /sessions/{id}                        -> 204

Like Miles' v1 session server, a session's next request must extend the messages it already holds (the
assistant reply echoed exactly), and may append only `allowed_append_roles`; otherwise it answers 400.
Token counts in `usage` come from `count_tokens`, a deterministic word/punctuation count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """Words and punctuation marks in `text`: the scripted server's stand-in for a tokenizer."""
    return len(_TOKEN.findall(text or ""))


@dataclass
class Reply:
    """One scripted model reply. `delay` seconds pass before it is sent (to simulate a slow model)."""

    content: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    delay: float = 0.0
    finish_reason: str | None = None  # default: "tool_calls" when there are tool calls, else "stop"
    status: int = 200  # a non-200 status answers {"error": content}
    prompt_tokens: int | None = None  # override the counted usage
    completion_tokens: int | None = None


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """An OpenAI tool call; a dict is JSON-encoded, a string is sent as written (e.g. malformed JSON)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": name, "arguments": raw}}


Script = Sequence[Reply | str] | Callable[[dict[str, Any], str | None], Reply | str]
_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def sglang_tool_parser(text: str) -> tuple[str, list[dict[str, Any]], bool]:
    """What SGLang's `qwen25` tool-call parser makes of a model's raw text: (content, tool_calls, announced).

    Each `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block becomes a call; a block whose JSON does
    not parse is dropped without a trace, as SGLang does. The content is the text before the first block, and
    `announced` (finish_reason "tool_calls") is True whenever a block was there, parsed or not.
    """
    blocks = list(_TOOL_BLOCK.finditer(text))
    if not blocks:
        return text, [], False
    calls = []
    for block in blocks:
        try:
            value = json.loads(block.group(1))
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            calls.append(tool_call(value["name"], value.get("arguments") or {}))
    return text[:blocks[0].start()].strip(), calls, True


def _norm(value: Any) -> Any:
    return None if value in (None, "", []) else value


def _same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Miles' comparison: role, content, reasoning_content and tool_calls, with None/""/[] equal."""
    return all(_norm(a.get(k)) == _norm(b.get(k)) for k in ("role", "content", "reasoning_content", "tool_calls"))


def _message_tokens(messages: list[dict[str, Any]]) -> int:
    total = 0
    for m in messages:
        total += 4 + count_tokens(str(m.get("content") or ""))
        for call in m.get("tool_calls") or []:
            total += count_tokens(call["function"]["name"]) + count_tokens(call["function"]["arguments"])
    return total


class ScriptedChat:
    """Serve `script`: a list of replies handed out in request order, or a function
    `(request body, session id or None) -> Reply | str` for replies that depend on the request."""

    def __init__(self, script: Script, *, allowed_append_roles: Sequence[str] = ("tool", "user"),
                 default: Reply | str | None = None,
                 tool_parser: Callable[[str], tuple[str, list[dict[str, Any]], bool]] | None = None) -> None:
        if not callable(script) and not isinstance(script, Sequence):
            raise TypeError("script must be a list of replies or a function (body, session_id) -> Reply")
        self._script = script
        self._next = 0
        self.default = default
        self.allowed_append_roles = tuple(allowed_append_roles)
        # With a parser, a reply's content is the model's raw text and the parser makes the tool calls (as an
        # inference server does); without one, replies carry their tool calls ready-made.
        self.tool_parser = tool_parser
        self.requests: list[dict[str, Any]] = []  # every chat body received, in order (session id under "_session")
        self.sessions: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.app = self._build()

    def _reply_for(self, body: dict[str, Any], session_id: str | None) -> Reply:
        if callable(self._script):
            reply = self._script(body, session_id)
        elif self._next < len(self._script):
            reply = self._script[self._next]
            self._next += 1
        elif self.default is not None:
            reply = self.default
        else:
            reply = Reply(content=f"the script has no reply left (it had {len(self._script)})", status=500)
        return Reply(content=reply) if isinstance(reply, str) else reply

    def _check_history(self, session: dict[str, Any], messages: list[dict[str, Any]]) -> str | None:
        held = session["messages"]
        if not held:
            return None
        if len(messages) < len(held) or not all(_same_message(a, b) for a, b in zip(held, messages, strict=False)):
            return "the request does not extend the session's messages (echo the assistant reply exactly)"
        extra = [m.get("role") for m in messages[len(held):]]
        bad = [r for r in extra if r not in self.allowed_append_roles]
        if bad:
            return f"appended roles {bad} are not allowed; allowed={list(self.allowed_append_roles)}"
        return None

    async def _complete(self, body: dict[str, Any], session_id: str | None) -> Response:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return JSONResponse({"error": "messages must be a non-empty list"}, status_code=400)
        session = self.sessions.get(session_id) if session_id is not None else None
        if session_id is not None:
            if session is None:
                return JSONResponse({"error": f"session {session_id} not found"}, status_code=404)
            problem = self._check_history(session, messages)
            if problem:
                return JSONResponse({"error": problem}, status_code=400)
        self.requests.append({**body, "_session": session_id})
        reply = self._reply_for(body, session_id)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return JSONResponse({"error": reply.content}, status_code=reply.status)
        content, tool_calls, announced = reply.content, reply.tool_calls, bool(reply.tool_calls)
        if self.tool_parser is not None:
            content, tool_calls, announced = self.tool_parser(reply.content)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reply.reasoning_content is not None:
            message["reasoning_content"] = reply.reasoning_content
        if tool_calls:
            message["tool_calls"] = tool_calls
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else _message_tokens(messages)
        completion = reply.completion_tokens
        if completion is None:
            completion = max(1, _message_tokens([message]) - 4)
        finish = reply.finish_reason or ("tool_calls" if announced else "stop")
        response = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": "scripted", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion},
        }
        if session is not None:
            session["messages"] = [*messages, message]
            session["records"].append({"timestamp": time.time(), "method": "POST", "path": "/v1/chat/completions",
                                       "status_code": 200, "request": body, "response": response})
        return JSONResponse(response)

    def _build(self) -> FastAPI:
        app = FastAPI(title="scripted chat")

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self._complete(await request.json(), None)

        @app.post("/sessions")
        async def open_session() -> dict[str, str]:
            sid = uuid.uuid4().hex
            self.sessions[sid] = {"messages": [], "records": []}
            return {"session_id": sid}

        @app.post("/sessions/{sid}/v1/chat/completions")
        async def session_chat(sid: str, request: Request) -> Response:
            return await self._complete(await request.json(), sid)

        @app.get("/sessions/{sid}")
        async def get_session(sid: str) -> Response:
            if sid not in self.sessions:
                return JSONResponse({"error": f"session {sid} not found"}, status_code=404)
            return JSONResponse({"session_id": sid, "records": self.sessions[sid]["records"], "metadata": {}})

        @app.delete("/sessions/{sid}")
        async def delete_session(sid: str) -> Response:
            if self.sessions.pop(sid, None) is None:
                return JSONResponse({"error": f"session {sid} not found"}, status_code=404)
            self.deleted.append(sid)
            return Response(status_code=204)

        return app

    def session_requests(self, session_id: str) -> list[dict[str, Any]]:
        """The chat bodies a session received, in order."""
        return [r for r in self.requests if r["_session"] == session_id]

    @contextlib.contextmanager
    def serve(self, host: str = "127.0.0.1") -> Iterator[str]:
        """`with chat.serve() as url:` serves the script on a free loopback port."""
        from agentrl.uvicorn_servers import serve_in_background

        with serve_in_background(self.app, host) as url:
            yield url
