"""One model turn over an OpenAI-compatible `/v1/chat/completions` endpoint (a session's `base_url`)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrl.agents.record import Failure, Rollout, Turn


class ChatError(Exception):
    """A model turn that failed; `failure` is the flag the rollout carries (model_timeout, model_error, ...)."""

    def __init__(self, failure: str, message: str) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass
class ChatReply:
    """The assistant message exactly as returned (echo it back unchanged), and what the turn cost."""

    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def vary_seed(request_kwargs: dict[str, Any], what: str, k: int) -> dict[str, Any]:
    """`request_kwargs` with the sampling `seed` derived for the `k`-th `what` (a "turn" of a conversation, a
    "session" of a play); k=0 and requests without a seed are returned unchanged.

    An engine re-seeds its generator with each request's seed (ours, SGLang), so a play that sent one seed on
    every request would draw the same random numbers on every turn: a retried illegal move repeats, and two
    sessions reading the same prompt are copies. The derived seeds stay a pure function of the play's seed.
    """
    seed = request_kwargs.get("seed")
    if seed is None or k == 0:
        return request_kwargs
    digest = hashlib.sha256(f"{int(seed)}/{what}/{k}".encode()).digest()
    return {**request_kwargs, "seed": int.from_bytes(digest[:4], "little") & 0x7FFFFFFF}


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """A rough token count for text the endpoint has not counted yet (about 4 characters a token)."""
    chars = 0
    for m in messages:
        chars += 16 + len(str(m.get("content") or ""))
        for call in m.get("tool_calls") or []:
            chars += len(str(call.get("function", {}).get("arguments", "")))
    return chars // 4 + 1


async def chat(
    client: httpx.AsyncClient,
    base_url: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    request_kwargs: dict[str, Any] | None = None,
    max_tokens: int | None = None,
    timeout: float = 600.0,
) -> ChatReply:
    """POST one chat completion to `{base_url}/v1/chat/completions`; raises ChatError, never hangs past `timeout`."""
    body: dict[str, Any] = {k: v for k, v in (request_kwargs or {}).items() if k not in ("messages", "tools")}
    body["messages"] = messages
    if tools:
        body["tools"] = tools
    if max_tokens is not None:
        body["max_tokens"] = min(int(body.get("max_tokens") or max_tokens), int(max_tokens))
    url = f"{base_url.rstrip('/')}/v1/chat/completions"
    try:
        response = await client.post(url, json=body, timeout=timeout)
    except httpx.TimeoutException as exc:
        raise ChatError("model_timeout", f"no reply from {url} within {timeout:g}s") from exc
    except httpx.HTTPError as exc:
        raise ChatError("model_gone", f"could not reach {url}: {exc!r}") from exc
    if response.status_code != 200:
        raise ChatError("model_error", f"{url} answered HTTP {response.status_code}: {response.text[:500]}")
    try:
        data = response.json()
        choice = data["choices"][0]
        message = dict(choice["message"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ChatError("model_error", f"{url} sent a malformed completion: {response.text[:300]}") from exc
    usage = data.get("usage") or {}
    meta = choice.get("meta_info") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or meta.get("prompt_tokens") or estimate_tokens(messages))
    completion_tokens = int(usage.get("completion_tokens") or meta.get("completion_tokens") or 0)
    return ChatReply(
        message=message,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        tool_calls=list(message.get("tool_calls") or []),
    )


def _since_last_reply(messages: list[dict[str, Any]], record: Rollout) -> list[dict[str, Any]]:
    """The messages after the record's previous reply (all of them before its first): a transcript's delta."""
    if record.transcript:
        last = record.transcript[-1].reply
        for i in range(len(messages) - 1, -1, -1):
            if messages[i] is last:
                return messages[i + 1:]
    return list(messages)


async def role_turn(client: httpx.AsyncClient, base_url: str, messages: list[dict[str, Any]], record: Rollout,
                    *, request_kwargs: dict[str, Any], max_response_tokens: int | None = None,
                    max_context_tokens: int | None = None, timeout: float = 600.0) -> ChatReply | None:
    """One tool-less model turn on a role's conversation: appends the reply to `messages` and counts it in
    `record`; on failure (or when the turn would not fit `max_context_tokens`) flags `record`, returns None."""
    if max_context_tokens is not None:
        context = record.context_tokens + estimate_tokens(messages[-1:]) if record.turns \
            else estimate_tokens(messages)
        if context + (max_response_tokens or 0) > max_context_tokens:
            record.flag(Failure.OVER_BUDGET, f"about {context} tokens + a reply exceed {max_context_tokens}")
            return None
    began = time.time_ns()
    try:
        reply = await chat(client, base_url, messages, request_kwargs=vary_seed(request_kwargs, "turn", record.turns),
                           max_tokens=max_response_tokens, timeout=timeout)
    except ChatError as exc:
        record.flag(Failure(exc.failure), str(exc))
        return None
    record.transcript.append(Turn(request=_since_last_reply(messages, record), reply=reply.message,
                                  finish_reason=reply.finish_reason, start_ns=began, end_ns=time.time_ns()))
    messages.append(reply.message)
    record.turns += 1
    record.completion_tokens += reply.completion_tokens
    record.context_tokens = reply.total_tokens
    return reply
