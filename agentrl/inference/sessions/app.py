"""The session server: OpenAI chat completions per session, token-in/token-out, API-compatible with Miles.

Endpoints (as Miles' session server v1):
  GET    /health                                   {"status": "ok", "weight_version": int}; 503 once the
                                                   engine cannot serve (its worker died, or it was closed)
  POST   /sessions                                 {"session_id": hex}
  GET    /sessions/{id}                            {"session_id", "records": [...], "metadata": {...}}
  DELETE /sessions/{id}                            204; 404 when unknown
  POST   /sessions/{id}/v1/chat/completions        an OpenAI chat completion, recorded
  GET    /v1/models, /sessions/{id}/v1/models      the one served model

A record is `{"timestamp", "method", "path", "status_code", "request": <body + "input_ids">,
"response": <the JSON returned>}`; the response's `choices[0].meta_info` carries
`output_token_logprobs` ([[logprob, token_id], ...]), `completion_tokens`, `prompt_tokens`,
`cached_tokens`, `weight_version` and `tool_call_errors`. `assemble_sample` turns records into a Sample.
Errors come back as `{"error": "..."}`: 400 bad or non-extending request (the body is checked by
`agentrl.inference.sessions.schema.ChatCompletionRequest`, and the message names the field; a tool message
must answer a call of the assistant message before it, `tito.check_tool_replies`), 404 unknown
session, 413 a body over `max_body_bytes` (`agentrl.inference.sessions.body_limit`), 500 a chat template
that cannot extend a turn, 503 an engine that cannot serve (the message names why; every request
waiting on a dead engine gets it at once) or a turn still running when shutdown's grace period ends
(`agentrl.inference.sessions.draining`).

Limits, so that no request can stall or crash the server: the body's size (`max_body_bytes`);
`max_tokens` / `max_completion_tokens` at most the model's context (`schema.request_model`); a
prompt that cannot fit the context is refused before it is tokenized when its length alone shows
it, else after (`agentrl.inference.sessions.prompt_tokens`); a tokenizer that fails or panics on a prompt is a
400. Parsing and validating the body, rendering and tokenizing run on worker threads (a lane of their
own for large requests), so `/health` and the other sessions answer meanwhile.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from agentrl.inference.engines.completion import EngineUnavailable
from agentrl.inference.engines.protocol import Engine
from agentrl.inference.sessions import tito
from agentrl.inference.sessions.body_limit import MAX_BODY_BYTES, BodyLimit
from agentrl.inference.sessions.draining import Drain, ServerShuttingDown
from agentrl.inference.sessions.prompt_tokens import PromptEncoder, model_context
from agentrl.inference.sessions.schema import describe, inline_schema, parse_request, request_model
from agentrl.inference.sessions.tito import MessageValidationError, TokenizationError
from agentrl.models.tool_calls import tool_call_parser

__all__ = ["MAX_BODY_BYTES", "SessionNotFoundError", "SessionStore", "build_session_app", "engine_failure"]


class SessionNotFoundError(KeyError):
    """No session with that id (HTTP 404)."""


@dataclass
class Session:
    """One rollout's conversation and the exact token ids the model has seen and produced."""

    id: str
    messages: list[dict[str, Any]] = field(default_factory=list)  # ends with the server's assistant reply
    tools: list[Any] | None = None
    tools_key: str = "null"  # canonical JSON of `tools`, for comparing later requests
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)  # last prompt + last completion
    ended_with_stop: bool = False  # the last completion ended with the end-of-turn token
    records: list[dict[str, Any]] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionStore:
    """Thread-safe map of sessions; the trainer may read records from another thread."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self) -> str:
        sid = uuid.uuid4().hex
        with self._lock:
            self._sessions[sid] = Session(sid)
        return sid

    def get(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    def __contains__(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions

    def delete(self, session_id: str) -> None:
        with self._lock:
            if self._sessions.pop(session_id, None) is None:
                raise SessionNotFoundError(session_id)

    def records(self, session_id: str) -> list[dict[str, Any]]:
        """A copy of the session's records, oldest first."""
        return copy.deepcopy(self.get(session_id).records)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def engine_failure(engine: Any) -> str | None:
    """Why `engine` cannot serve, or None while it can (engines without a `failure` are assumed able)."""
    # Optional, not in the `Engine` protocol: the embedded engine (and its process) fail as a whole and say so here;
    # vLLM's and SGLang's fail per call (a dead server), so their /health stays 200.
    failure = getattr(engine, "failure", None)
    return None if failure is None else str(failure)


def build_session_app(engine: Engine, tokenizer: Any = None, *, default_max_tokens: int = 512,
                      store: SessionStore | None = None, model_name: str | None = None,
                      max_body_bytes: int = MAX_BODY_BYTES, tool_format: str = "qwen") -> FastAPI:
    """The session server as a FastAPI app over `engine` (any `Engine`: embedded, vLLM, SGLang).

    `tokenizer` renders the chat template (a tokenizer object or a folder; default `engine.tokenizer`).
    `store` lets the caller keep a handle on the sessions (also at `app.state.sessions`).
    A body over `max_body_bytes` answers 413 before more than that is read. `app.state.drain.begin(grace_s)`
    (uvicorn_servers' `on_shutdown` hook) makes turns still running near the grace's end answer 503. `tool_format` names the parser of
    the model's tool calls (`model.tool_format`: `agentrl.models.tool_calls.PARSERS`).
    """
    parse_calls = tool_call_parser(tool_format)
    if tokenizer is None:
        tokenizer = engine.tokenizer
    elif isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat template; the session server needs one")
    store = SessionStore() if store is None else store
    model_name = model_name or str(engine.model_path)
    vocab = tokenizer.get_vocab()
    end_text = "<|im_end|>" if "<|im_end|>" in vocab else tokenizer.eos_token

    context = model_context(engine, tokenizer)
    prompts = PromptEncoder(tokenizer)
    drain = Drain()

    # strict_content_type off: a JSON body without a Content-Type header is parsed, as before
    app = FastAPI(title="agentrl session server", strict_content_type=False)
    app.add_middleware(BodyLimit, max_bytes=int(max_body_bytes))
    app.state.sessions = store
    app.state.engine = engine
    app.state.tokenizer = tokenizer
    app.state.prompts = prompts
    app.state.drain = drain

    @app.exception_handler(SessionNotFoundError)
    async def _not_found(_: Request, exc: SessionNotFoundError) -> JSONResponse:
        return _error(404, f"session {exc.args[0]} not found")

    @app.exception_handler(MessageValidationError)
    async def _bad_request(_: Request, exc: MessageValidationError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"invalid request: {describe(exc.errors())}")

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:  # FastAPI's 404/405, unparsable bodies
        detail = str(exc.detail)
        if isinstance(exc.__cause__, RecursionError):
            detail = "the body nests deeper than the JSON parser allows"
        elif isinstance(exc.__cause__, ValueError):  # e.g. bytes that are no text encoding JSON allows
            detail = f"the body is not valid JSON ({exc.__cause__})"
        return JSONResponse({"error": detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(TokenizationError)
    async def _tokenization(_: Request, exc: TokenizationError) -> JSONResponse:
        return _error(500, str(exc))

    @app.exception_handler(EngineUnavailable)
    async def _unavailable(_: Request, exc: EngineUnavailable) -> JSONResponse:
        return _error(503, f"the engine cannot serve: {exc}")

    @app.exception_handler(ServerShuttingDown)
    async def _shutting_down(_: Request, exc: ServerShuttingDown) -> JSONResponse:
        return _error(503, str(exc))

    @app.get("/health")
    async def health() -> JSONResponse:
        failure = engine_failure(engine)
        body = {"status": "ok" if failure is None else "unavailable",
                "weight_version": engine.weight_version, "sessions": len(store)}
        if failure is not None:
            body["error"] = failure
        return JSONResponse(body, status_code=200 if failure is None else 503)

    @app.get("/v1/models")
    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str | None = None) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "agentrl"}]}

    @app.post("/sessions")
    async def create_session() -> dict[str, str]:
        return {"session_id": store.create()}

    @app.get("/sessions/{session_id}")
    async def get_session(session_id: str) -> dict[str, Any]:
        session = store.get(session_id)
        return {"session_id": session_id, "records": copy.deepcopy(session.records),
                "metadata": _session_metadata(session, tokenizer)}

    @app.delete("/sessions/{session_id}")
    async def delete_session(session_id: str) -> Response:
        session = store.get(session_id)
        async with session.lock:  # let a turn in flight finish recording first
            store.delete(session_id)
        return Response(status_code=204)

    def first_ids(messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], room: int | None) -> list[int]:
        text = tito.render_text(tokenizer, messages, tools, True, kwargs)
        return prompts.encode(text, room, "the prompt", messages)

    def suffix_ids(session: Session, added: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any],
                   room: int | None) -> list[int]:
        text = tito.suffix_text(tokenizer, session.messages, added, tools, kwargs, end_text, session.ended_with_stop)
        return prompts.encode(text, room, "the text the new messages add", added)

    request_cls = request_model(context)  # max_tokens bounded by the model's context

    def parse(raw: bytes) -> tuple[Any, dict[str, Any]]:
        chat = parse_request(raw, request_cls)
        return chat, chat.record()  # the record copies every value of the body: as slow as validating it

    # The body is read here and parsed on a worker thread: a body of a million JSON values takes seconds to
    # parse and validate, which must not stall the event loop. Its schema still shows in the OpenAPI document.
    @app.post("/sessions/{session_id}/v1/chat/completions", openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": inline_schema(request_cls)}}}})
    async def chat_completions(session_id: str, request: Request) -> Any:
        raw = await request.body()
        chat, body = await prompts.run(len(raw), parse, raw)
        session = store.get(session_id)
        params = chat.sampling(default_max_tokens)
        messages = [tito.normalize_message(m, i) for i, m in enumerate(body["messages"])]
        tito.check_tool_replies(messages)
        tools = body.get("tools") or None
        kwargs = body.get("chat_template_kwargs") or {}
        return await drain.guard(turn(session, body, params, messages, tools, kwargs))

    async def turn(session: Session, body: dict[str, Any], params: dict[str, Any], messages: list[dict[str, Any]],
                   tools: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        tools_key = json.dumps(tools, sort_keys=True)
        chars = len(tools_key) + sum(len(m.get("content") or "") for m in messages)  # about what rendering costs
        async with session.lock:
            if session.id not in store:  # deleted while this request waited for the lock
                raise SessionNotFoundError(session.id)
            if not session.messages:
                room = None if context is None else context - 1  # the engine needs room for one token
                prompt = await prompts.run(chars, first_ids, messages, tools, kwargs, room)
                cached = 0
            else:
                if tools_key != session.tools_key:
                    raise MessageValidationError("tools differ from the session's first request; a session keeps its tools")
                added = tito.new_messages(session.messages, messages)
                room = None if context is None else max(0, context - 1 - len(session.token_ids))
                suffix = await prompts.run(chars, suffix_ids, session, added, tools, kwargs, room)
                prompt = session.token_ids + suffix
                cached = len(session.token_ids)
            try:
                completion = await engine.generate(prompt, **params)
            except ValueError as exc:
                raise MessageValidationError(str(exc)) from exc
            response, assistant = _response(completion, tokenizer, prompt, cached, model_name, parse_calls)
            stop_text = tokenizer.decode(completion.token_ids[-1:]) if completion.token_ids else ""
            session.messages = messages + [tito.normalize_message(assistant, len(messages))]
            session.tools, session.tools_key = tools, tools_key
            session.template_kwargs = kwargs
            session.token_ids = prompt + list(completion.token_ids)
            session.ended_with_stop = completion.finish_reason == "stop" and stop_text == end_text
            session.records.append({
                "timestamp": time.time(), "method": "POST", "path": "/v1/chat/completions", "status_code": 200,
                "request": {**body, "input_ids": prompt}, "response": response,
            })
        return response

    return app


def _response(completion: Any, tokenizer: Any, prompt: list[int], cached: int, model_name: str,
              parse_calls: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    ids = list(completion.token_ids)
    text_ids = ids[:-1] if completion.finish_reason == "stop" and ids else ids  # drop the stop token's text
    text = tokenizer.decode(text_ids, skip_special_tokens=False)
    content, tool_calls, errors = parse_calls(text)
    if completion.finish_reason == "length":
        finish = "length"
    else:
        finish = "tool_calls" if tool_calls else "stop"
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    response = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": None,
            "meta_info": {
                "output_token_logprobs": [[lp, t] for lp, t in zip(completion.logprobs, ids, strict=True)],
                "completion_tokens": len(ids),
                "prompt_tokens": len(prompt),
                "cached_tokens": cached,
                "weight_version": getattr(completion, "weight_version", 0),
                "token_weight_versions": _token_versions(completion),
                "tool_call_errors": errors,
            },
        }],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)},
    }
    return response, message


def _token_versions(completion: Any) -> list[int]:
    """The version that sampled each output token (a push in keep mode may land mid-reply)."""
    versions = getattr(completion, "token_versions", None)
    return list(versions) if versions else [getattr(completion, "weight_version", 0)] * len(completion.token_ids)


def _session_metadata(session: Session, tokenizer: Any) -> dict[str, Any]:
    """Miles' session metadata, with `tito_session_mismatch` from a canonical re-render."""
    meta: dict[str, Any] = {"accumulated_token_ids": list(session.token_ids), "max_trim_tokens": 0}
    if session.messages:
        try:
            rendered = tito.render_text(tokenizer, session.messages, session.tools, False,
                                      session.template_kwargs)
        except MessageValidationError:
            return meta
        decoded = tokenizer.decode(session.token_ids, skip_special_tokens=False)
        if rendered.startswith(decoded) and _only_closes_the_turn(tokenizer, rendered[len(decoded):]):
            meta["tito_session_mismatch"] = []
        else:
            at = next((i for i, (a, b) in enumerate(zip(decoded, rendered, strict=False)) if a != b),
                      min(len(decoded), len(rendered)))
            meta["tito_session_mismatch"] = [{"type": "text", "position": at,
                                              "tokens": decoded[at:at + 40], "rendered": rendered[at:at + 40]}]
    return meta


def _only_closes_the_turn(tokenizer: Any, tail: str) -> bool:
    """Whether what the canonical render adds past the session's tokens is whitespace and special tokens only: a
    last reply cut at its length has no end-of-turn token, which the render writes (`<|im_end|>`)."""
    if not tail.strip():
        return True
    ids = tokenizer.encode(tail, add_special_tokens=False)
    special = set(tokenizer.all_special_ids)
    return all(i in special or not tokenizer.decode([i]).strip() for i in ids)
