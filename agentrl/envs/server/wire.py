"""The OpenEnv wire format: message models, error frames, observation envelopes and tool shapes.

Shapes follow OpenEnv's `/ws` protocol (0.3's, unchanged in 0.10) with 0.10's envelope, which carries the
observation's `metadata` both inside `observation` and at the top level (when non-empty), so that
clients of either version read the prompt, scores and errors.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from agentrl.envs import strict_json

# WebSocket error codes (openenv's WSErrorCode).
INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
SESSION_ERROR = "SESSION_ERROR"  # openenv 0.10: a `/ws?session_id=` that names no session it can join

# Tool error types (openenv's ToolErrorType); any other value breaks the client's parser.
TOOL_NOT_FOUND = "tool_not_found"
INVALID_ARGS = "invalid_args"
EXECUTION = "execution_error"
TRANSPORT = "transport_error"
TIMEOUT = "timeout"

END_TURN = "end_turn"
END_TURN_TOOL: dict[str, Any] = {
    "name": END_TURN,
    "description": (
        "End your turn with your reply. The episode goes on to your next turn, or ends and is scored."
    ),
    "input_schema": {
        "type": "object",
        "properties": {"response": {"type": "string", "description": "Your reply."}},
    },
}
# Names the protocol itself uses; a bundle tool with one of these names would be unreachable.
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close", END_TURN})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResetMessage(_Strict):
    type: Literal["reset"]
    data: dict[str, Any] = Field(default_factory=dict)


class StepMessage(_Strict):
    type: Literal["step"]
    data: dict[str, Any]


class StateMessage(_Strict):
    type: Literal["state"]


class CloseMessage(_Strict):
    type: Literal["close"]


class MCPMessage(_Strict):
    type: Literal["mcp"]
    data: dict[str, Any]


MESSAGES: dict[str, type[BaseModel]] = {
    "reset": ResetMessage,
    "step": StepMessage,
    "state": StateMessage,
    "close": CloseMessage,
    "mcp": MCPMessage,
}


class ResetData(BaseModel):
    """The keys of a reset we read; others (seed, episode_id, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    split: StrictStr | None = None
    index: StrictInt | None = None


class ListToolsAction(_Strict):
    type: Literal["list_tools"] = "list_tools"
    metadata: dict[str, Any] = Field(default_factory=dict)


class CallToolAction(_Strict):
    type: Literal["call_tool"] = "call_tool"
    tool_name: StrictStr
    arguments: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ToolSchema(_Strict):
    name: str
    description: str
    input_schema: dict[str, Any]


class ToolErrorSchema(_Strict):
    error_type: Literal["execution_error", "invalid_args", "transport_error", "tool_not_found", "timeout"]
    message: str


class ObservationSchema(_Strict):
    """What `observation` holds in our replies (for `/schema`): a call-tool or list-tools observation."""

    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    tool_name: str | None = None
    result: Any = None
    error: ToolErrorSchema | None = None
    tools: list[ToolSchema] | None = None


class StateSchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    episode_id: str | None = None
    step_count: int = Field(default=0, ge=0)


def parse_action(data: dict[str, Any]) -> ListToolsAction | CallToolAction:
    """The step's action; a missing `type` means call_tool, as with openenv's CallToolAction."""
    if data.get("type") == "list_tools":
        return ListToolsAction.model_validate(data)
    return CallToolAction.model_validate(data)


# Deepest nesting a client frame may have. Python's JSON codecs recurse, so a small frame nested ~1,000 deep
# raises RecursionError (not ValueError); anything past this depth is refused as invalid JSON instead.
MAX_DEPTH = 100


def loads(text: str) -> Any:
    """A client frame's JSON. ValueError (with why) for text that is not strict JSON (NaN, Infinity and 1e400
    included: they would reach the tools as floats no JSON peer can send back) or is nested too deep."""
    try:
        value = strict_json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    # The bracket count bounds the depth, so the walk runs only for frames that could be too deep.
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` nests objects/arrays more than `limit` deep (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def dumps(frame: dict[str, Any]) -> str:
    """A reply frame as strict JSON: a NaN or infinity anywhere in it (a bundle's odd result) is spelled as a
    string rather than written as `NaN`, which no strict parser reads."""
    try:
        return strict_json.dumps(frame, separators=(",", ":"), ensure_ascii=False, default=str)
    except ValueError:
        return strict_json.dumps(json_safe(frame), separators=(",", ":"), ensure_ascii=False, default=str)


# How much of a client's own input a reply echoes back: enough to recognise it, never the whole of a 16 MiB frame.
ECHO_CHARS = 200
MAX_MESSAGE_CHARS = 2000  # an error message, whatever text (an exception's) went into it
MAX_ERRORS = 20  # validation errors listed in one error frame


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text`, or its first `limit` characters and how many more were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def error_frame(code: str, message: str, **extra: Any) -> str:
    return dumps({"type": "error", "data": {"message": clip(message, MAX_MESSAGE_CHARS), "code": code, **extra}})


def validation_error_frame(exc: ValidationError) -> str:
    """VALIDATION_ERROR listing pydantic's errors, each echoing at most ECHO_CHARS of what it refused."""
    errors = exc.errors(include_url=False, include_context=False)
    listed = [_bounded_error(e) for e in errors[:MAX_ERRORS]]
    extra = {"errors_cut": len(errors) - MAX_ERRORS} if len(errors) > MAX_ERRORS else {}
    return error_frame(VALIDATION_ERROR, "Invalid message", errors=listed, **extra)


def _bounded_error(error: Any) -> dict[str, Any]:
    out = json.loads(dumps({"e": error}))["e"]
    out["loc"] = [clip(p) if isinstance(p, str) else p for p in out.get("loc", [])]
    given = out.get("input")
    text = given if isinstance(given, str) else json.dumps(given)
    if len(text) > ECHO_CHARS:
        out["input"] = clip(text)
    return out


def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinite float spelled as a string (see `strict_json.non_finite_as_text`)."""
    return strict_json.non_finite_as_text(value)


def envelope(
    observation: dict[str, Any],
    *,
    reward: float | None = None,
    done: bool = False,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An observation reply's `data` in openenv 0.10's form: metadata nested always, top-level if non-empty."""
    meta = metadata or {}
    observation["metadata"] = meta
    data: dict[str, Any] = {"observation": observation, "reward": reward, "done": done}
    if meta:
        data["metadata"] = meta
    return data


def observation_frame(data: dict[str, Any]) -> str:
    return dumps({"type": "observation", "data": data})


def text_result(text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A tool result shaped like FastMCP's CallToolResult; openenv's `call_tool()` returns its `data`."""
    return {
        "content": [{"type": "text", "text": text}],
        "structured_content": None,
        "meta": None,
        "data": text,
        "is_error": is_error,
    }


def tool_error(error_type: str, message: str) -> dict[str, str]:
    return {"error_type": error_type, "message": message}


def mcp_tool(openai_tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function schema as an MCP tool (name, description, input_schema); never null fields."""
    fn = openai_tool.get("function", openai_tool)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool schema without a name: {openai_tool!r}")
    schema = fn.get("parameters") or fn.get("input_schema") or {"type": "object", "properties": {}}
    return {"name": name, "description": fn.get("description") or "", "input_schema": schema}


def jsonrpc_result(rid: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def jsonrpc_error(rid: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": clip(message, MAX_MESSAGE_CHARS),
                                                   "data": data}}


def schema() -> dict[str, Any]:
    """The `/schema` reply: action, observation and state JSON schemas."""
    return {
        "action": CallToolAction.model_json_schema(),
        "observation": ObservationSchema.model_json_schema(),
        "state": StateSchema.model_json_schema(),
    }


async def receive_text(websocket: Any) -> str | None:
    """The next frame as text (a binary frame decoded as UTF-8; UnicodeDecodeError when it is not), or None once
    the client has gone."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    text = message.get("text")
    return text if text is not None else (message.get("bytes") or b"").decode("utf-8")
