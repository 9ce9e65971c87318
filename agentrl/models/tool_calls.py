"""Tool calls in a Qwen3-style completion: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` blocks."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]], list[str]]:
    """Split a completion into (content, tool calls, errors).

    Every well-formed `<tool_call>` block becomes an OpenAI tool call
    `{"id", "type": "function", "function": {"name", "arguments": <JSON object as a string>}}` and is removed
    from the content. A block that is not valid JSON, lacks a string `name`, has arguments that are not a JSON
    object (or a string holding one), or is never closed stays in the content as plain text and adds one error.
    When calls were found the content is stripped of surrounding whitespace (the chat template puts the
    newline before a call back); otherwise it is the text unchanged.
    Arguments are kept exactly as written when they are a JSON object, so a re-rendered turn reproduces the
    model's text.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls takes the completion text (str), got {type(text).__name__}")
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        kept.append(text[pos:match.start()])
        pos = match.end()
        call, error = _parse_block(match.group(1))
        if call is None:
            errors.append(f"tool call {len(calls) + len(errors) + 1}: {error}")
            kept.append(match.group(0))
        else:
            calls.append(call)
    rest = text[pos:]
    if TOOL_CALL_OPEN in rest:
        errors.append(f"tool call {len(calls) + len(errors) + 1}: {TOOL_CALL_OPEN} is never closed by "
                      f"{TOOL_CALL_CLOSE}")
    kept.append(rest)
    content = "".join(kept).strip() if calls else "".join(kept)
    return content, calls, errors


def _parse_block(body: str) -> tuple[dict[str, Any] | None, str]:
    body = body.strip()
    try:
        obj = json.loads(body)
    except ValueError as e:
        return None, f"not valid JSON ({e}): {_clip(body)}"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object with 'name' and 'arguments', got {type(obj).__name__}: {_clip(body)}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, f"missing a string 'name': {_clip(body)}"
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # Some models write the arguments as a JSON string, as in the OpenAI wire format.
        try:
            decoded = json.loads(arguments)
        except ValueError as e:
            return None, f"arguments of {name!r} are a string that is not JSON ({e})"
        if not isinstance(decoded, dict):
            return None, f"arguments of {name!r} must be a JSON object, got {type(decoded).__name__}"
        raw = arguments
    elif isinstance(arguments, dict):
        raw = _raw_arguments(body, arguments)
    else:
        return None, f"arguments of {name!r} must be a JSON object, got {type(arguments).__name__}"
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": raw}}, ""


def _raw_arguments(body: str, arguments: dict[str, Any]) -> str:
    """The arguments' own text in `body` when it can be found unambiguously, else a fresh JSON dump."""
    decoder = json.JSONDecoder()
    for key in _ARGUMENTS_KEY.finditer(body):
        try:
            value, end = decoder.raw_decode(body, key.end())
        except ValueError:
            continue
        if value == arguments:
            return body[key.end():end]
    return json.dumps(arguments, ensure_ascii=False)


def _clip(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[:n] + "..."
