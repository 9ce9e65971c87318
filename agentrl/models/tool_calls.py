"""Tool calls in a completion, in the format the model was trained to write (`model.tool_format`).

- `qwen`, `hermes`: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` blocks (Qwen2.5/3, Hermes 2/3);
- `llama3`: Llama 3.1+'s JSON call, the whole reply `{"name": ..., "parameters": ...}`, optionally after
  `<|python_tag|>`, several separated by `;`;
- `mistral`: `[TOOL_CALLS] [{"name": ..., "arguments": ...}, ...]` after any content.

Every parser returns (content, calls, errors) the same way: a call it cannot read stays in the content as text
and adds one error naming why; none raises on what a model writes.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from collections.abc import Callable
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_ARGUMENTS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
Parsed = tuple[str, list[dict[str, Any]], list[str]]


def parse_tool_calls(text: str, tool_format: str = "qwen") -> Parsed:
    """Split a completion into (content, tool calls, errors) with the parser of `tool_format`.

    ValueError for a format that is not one of `TOOL_FORMATS` (a config error, not a model's).
    """
    return tool_call_parser(tool_format)(text)


def tool_call_parser(tool_format: str) -> Callable[[str], Parsed]:
    """The parser of `model.tool_format` (one of `TOOL_FORMATS`)."""
    try:
        return PARSERS[tool_format]
    except (KeyError, TypeError):
        raise ValueError(f"model.tool_format={tool_format!r}: choose one of {', '.join(PARSERS)}") from None


def _check_text(text: Any) -> None:
    if not isinstance(text, str):
        raise TypeError(f"a tool-call parser takes the completion text (str), got {type(text).__name__}")


def parse_tagged_calls(text: str) -> Parsed:
    """`qwen`/`hermes`: split a completion into (content, tool calls, errors).

    Every well-formed `<tool_call>` block becomes an OpenAI tool call
    `{"id", "type": "function", "function": {"name", "arguments": <JSON object as a string>}}` and is removed
    from the content. A block that is not valid JSON, lacks a string `name`, has arguments that are not a JSON
    object (or a string holding one), or is never closed stays in the content as plain text and adds one error.
    When calls were found the content is stripped of surrounding whitespace (the chat template puts the
    newline before a call back); otherwise it is the text unchanged.
    Arguments are kept exactly as written when they are a JSON object, so a re-rendered turn reproduces the
    model's text.
    """
    _check_text(text)
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


def _parse_block(body: str, make_id: Callable[[], str] | None = None) -> tuple[dict[str, Any] | None, str]:
    body = body.strip()
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:
        return None, f"not valid JSON ({e}): {_clip(body)}"
    return _call_from(obj, body, make_id)


def _call_from(obj: Any, body: str, make_id: Callable[[], str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """One decoded call object as an OpenAI tool call; `body` is its text (to keep the arguments as written)."""
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
        except (ValueError, RecursionError) as e:
            return None, f"arguments of {name!r} are a string that is not JSON ({e})"
        if not isinstance(decoded, dict):
            return None, f"arguments of {name!r} must be a JSON object, got {type(decoded).__name__}"
        raw = arguments
    elif isinstance(arguments, dict):
        raw = _raw_arguments(body, arguments)
    else:
        return None, f"arguments of {name!r} must be a JSON object, got {type(arguments).__name__}"
    return {"id": (make_id or _openai_id)(), "type": "function",
            "function": {"name": name, "arguments": raw}}, ""


def _openai_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _mistral_id() -> str:
    # Mistral's chat templates refuse any tool call id that is not exactly 9 letters and digits.
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


def parse_llama3_calls(text: str) -> Parsed:
    """`llama3`: a reply that is a JSON call (`{"name", "parameters"}`; `arguments` also read), optionally
    after `<|python_tag|>`, several separated by `;`. Any other reply is content. A reply that starts like a
    call but does not parse stays content, with one error."""
    _check_text(text)
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    if tagged:
        body = body[len(PYTHON_TAG):].strip()
    if not body.startswith("{"):
        if tagged:
            return text, [], [f"tool call 1: {PYTHON_TAG} is not followed by a JSON call: {_clip(body)}"]
        return text, [], []
    calls: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        try:
            obj, end = decoder.raw_decode(body, pos)
        except (ValueError, RecursionError) as e:
            return text, [], [f"tool call {len(calls) + 1}: not valid JSON ({e}): {_clip(body[pos:])}"]
        call, error = _call_from(obj, body[pos:end])
        if call is None:
            return text, [], [f"tool call {len(calls) + 1}: {error}"]
        calls.append(call)
        rest = body[end:].lstrip()
        if not rest:
            return "", calls, []
        if not rest.startswith(";"):
            return text, [], [f"tool call {len(calls)}: unexpected text after a call: {_clip(rest)}"]
        pos = len(body) - len(rest) + 1
        while pos < len(body) and body[pos].isspace():
            pos += 1


def parse_mistral_calls(text: str) -> Parsed:
    """`mistral`: content, then `[TOOL_CALLS]` and a JSON list of `{"name", "arguments"}` (one object also read).
    Unparsable calls stay in the content, with one error."""
    _check_text(text)
    at = text.find(MISTRAL_TOOL_CALLS)
    if at < 0:
        return text, [], []
    content, body = text[:at].strip(), text[at + len(MISTRAL_TOOL_CALLS):].strip()
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except (ValueError, RecursionError) as e:
        return text, [], [f"tool call 1: not valid JSON after {MISTRAL_TOOL_CALLS} ({e}): {_clip(body)}"]
    if body[end:].strip():
        return text, [], [f"tool call 1: unexpected text after the calls: {_clip(body[end:].strip())}"]
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        return text, [], [f"tool call 1: {MISTRAL_TOOL_CALLS} holds an empty list"]
    calls = []
    for i, item in enumerate(items, start=1):
        raw = json.dumps(item, ensure_ascii=False) if isinstance(item, dict) else str(item)
        call, error = _call_from(item, raw, _mistral_id)
        if call is None:
            return text, [], [f"tool call {i}: {error}"]
        calls.append(call)
    return content, calls, []


def _raw_arguments(body: str, arguments: dict[str, Any]) -> str:
    """The arguments' own text in `body` when it can be found unambiguously, else a fresh JSON dump."""
    decoder = json.JSONDecoder()
    for key in _ARGUMENTS_KEY.finditer(body):
        try:
            value, end = decoder.raw_decode(body, key.end())
        except (ValueError, RecursionError):
            continue
        if value == arguments:
            return body[key.end():end]
    return json.dumps(arguments, ensure_ascii=False)


def _clip(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[:n] + "..."


# model.tool_format -> its parser. qwen and hermes write the same blocks; both names are offered because model
# cards use either.
PARSERS: dict[str, Callable[[str], Parsed]] = {"qwen": parse_tagged_calls, "hermes": parse_tagged_calls,
                                               "llama3": parse_llama3_calls, "mistral": parse_mistral_calls}
TOOL_FORMATS = tuple(PARSERS)  # the schema's list (agentrl.config.model.TOOL_FORMATS) names the same
