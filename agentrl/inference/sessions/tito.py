"""Token-in/token-out rendering: the first prompt, and the tokens that extend a finished turn.

A later turn's prompt is `previous prompt ids + ids the model produced + suffix ids`, where the
suffix is rendered by the chat template: the conversation so far (with the last assistant content
replaced by a marker) plus the new tool/user messages and the generation prompt is rendered as
text, and the suffix is whatever follows the assistant's end-of-turn text after the marker. Only
the suffix is tokenized, so the model's own tokens are never re-tokenized.
"""

from __future__ import annotations

import json
from typing import Any

_MARKER = "\u2063agentrl-tito-marker\u2063"
_ROLES = {"system", "user", "assistant", "tool"}
APPEND_ROLES = {"tool", "user", "system"}


class MessageValidationError(ValueError):
    """The request's messages are malformed or do not extend the session (HTTP 400)."""


class TokenizationError(RuntimeError):
    """The chat template cannot produce the tokens a turn needs (HTTP 500)."""


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise MessageValidationError(f"{where}: only text content parts are supported, got {part!r}")
            parts.append(part["text"])
        return "".join(parts)
    raise MessageValidationError(f"{where}: content must be a string, a list of text parts or null")


def _arguments(args: Any) -> Any:
    """Arguments compared by value: a JSON string and the object it encodes are the same call."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def normalize_message(msg: Any, index: int) -> dict[str, Any]:
    """Validate one OpenAI chat message; returns a plain dict with text content."""
    where = f"messages[{index}]"
    if not isinstance(msg, dict):
        raise MessageValidationError(f"{where} must be an object")
    role = msg.get("role")
    if role not in _ROLES:
        raise MessageValidationError(f"{where}: role must be one of {sorted(_ROLES)}, got {role!r}")
    out: dict[str, Any] = {"role": role, "content": _text(msg.get("content"), where)}
    for key in ("name", "tool_call_id", "reasoning_content"):
        if msg.get(key) is not None:
            out[key] = msg[key]
    calls = msg.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise MessageValidationError(f"{where}: tool_calls must be a list on an assistant message")
        norm = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise MessageValidationError(f"{where}.tool_calls[{j}] needs function.name")
            norm.append({"id": call.get("id"), "type": "function",
                         "function": {"name": fn["name"], "arguments": fn.get("arguments", "{}")}})
        out["tool_calls"] = norm
    return out


def check_tool_replies(messages: list[dict[str, Any]]) -> None:
    """MessageValidationError naming the first tool message that answers no call: one must follow an assistant
    message with `tool_calls` (other tool messages between), and its `tool_call_id`, when it has one, must be one
    of that message's call ids. A missing id is accepted: chat templates place a result by its position."""
    calls_at: int | None = None  # the assistant message whose calls the tool messages here may answer
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role != "tool":
            calls_at = i if role == "assistant" and msg.get("tool_calls") else None
            continue
        if calls_at is None:
            raise MessageValidationError(
                f"messages[{i}]: a tool message must answer a tool call, so it must follow an assistant message "
                "with tool_calls (or another tool message answering one); send other text as a user message")
        call_id = msg.get("tool_call_id")
        ids = [c.get("id") for c in messages[calls_at]["tool_calls"]]
        if call_id and None not in ids and call_id not in ids:
            raise MessageValidationError(
                f"messages[{i}]: tool_call_id {str(call_id)[:64]!r} names none of the calls of messages[{calls_at}] "
                f"(their ids: {', '.join(repr(str(c)[:64]) for c in ids[:8])}{', ...' if len(ids) > 8 else ''})")


def _key(msg: dict[str, Any]) -> tuple:
    calls = tuple((c["function"]["name"], json.dumps(_arguments(c["function"]["arguments"]), sort_keys=True))
                  for c in msg.get("tool_calls") or ())
    return (msg["role"], msg.get("content") or "", msg.get("reasoning_content") or "", calls)


def new_messages(stored: list[dict[str, Any]], request: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages `request` appends to `stored`; MessageValidationError says why it does not extend it.

    Messages compare on role, content, reasoning_content and tool calls (name + arguments by
    value); null, "" and [] are equal. Only tool/user/system messages may be appended.
    """
    if len(request) < len(stored):
        raise MessageValidationError(
            f"the request has {len(request)} messages but the session already holds {len(stored)}: "
            "each request must repeat the whole conversation, including the assistant replies"
        )
    for i, (old, new) in enumerate(zip(stored, request, strict=False)):
        if _key(old) != _key(new):
            raise MessageValidationError(
                f"messages[{i}] ({new['role']}) differs from the session's message {i} ({old['role']}): "
                f"expected content {old.get('content')!r} and tool_calls {old.get('tool_calls')}, "
                f"got content {new.get('content')!r} and tool_calls {new.get('tool_calls')}; "
                "a session's requests must extend its conversation (echo assistant replies unchanged)"
            )
    added = request[len(stored):]
    if not added:
        raise MessageValidationError("the request adds no message after the last assistant reply")
    for j, msg in enumerate(added, start=len(stored)):
        if msg["role"] not in APPEND_ROLES:
            raise MessageValidationError(
                f"messages[{j}] has role {msg['role']!r}: only {sorted(APPEND_ROLES)} messages may follow "
                "the conversation; assistant turns come from the server"
            )
    return added


def render_text(tokenizer: Any, messages: list[dict], tools: list | None, add_generation_prompt: bool,
                kwargs: dict[str, Any]) -> str:
    """The chat template's text for `messages`."""
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
    except Exception as exc:  # jinja errors (raise_exception in a template) are bad requests
        raise MessageValidationError(f"the chat template rejected the messages: {exc}") from exc


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def first_prompt(tokenizer: Any, messages: list[dict], tools: list | None, kwargs: dict[str, Any]) -> list[int]:
    """Prompt ids of a session's first turn: the whole rendered conversation plus the generation prompt."""
    return encode(tokenizer, render_text(tokenizer, messages, tools, True, kwargs))


def suffix_ids(tokenizer: Any, stored: list[dict], added: list[dict], tools: list | None,
               kwargs: dict[str, Any], end_text: str, ended_with_stop: bool) -> list[int]:
    """Ids that follow the previous turn's output: closing scaffolding, `added` messages, generation prompt.

    `end_text` is the assistant turn's end-of-turn text (e.g. "<|im_end|>"); when the model already
    sampled it (`ended_with_stop`) it is not repeated, otherwise it is part of the suffix.
    """
    return encode(tokenizer, suffix_text(tokenizer, stored, added, tools, kwargs, end_text, ended_with_stop))


def suffix_text(tokenizer: Any, stored: list[dict], added: list[dict], tools: list | None,
                kwargs: dict[str, Any], end_text: str, ended_with_stop: bool) -> str:
    """The text `suffix_ids` tokenizes."""
    ctx = [dict(m) for m in stored]
    ctx[-1]["content"] = _MARKER
    ctx[-1].pop("reasoning_content", None)
    text = render_text(tokenizer, ctx + added, tools, True, kwargs)
    at = text.rfind(_MARKER)
    if at < 0:
        raise TokenizationError("the chat template does not render the assistant content; cannot extend the turn")
    end = text.find(end_text, at + len(_MARKER))
    if end < 0:
        raise TokenizationError(f"the chat template does not close the assistant turn with {end_text!r}")
    return text[end + len(end_text):] if ended_with_stop else text[end:]
