"""JSON-RPC over `/mcp` as OpenEnv 0.10 speaks it: `openenv/session/create|close`, `tools/list`, `tools/call`.

One handler answers the three carriers: HTTP `POST /mcp` (a request names its session in
`params.session_id`), the `/mcp` WebSocket and a `/ws` frame of type `mcp` (both always mean the
connection's own session, as in OpenEnv). Replies follow 0.10's `JsonRpcResponse`: `result` or `error`, never
both. Whatever a request holds, the reply is a JSON-RPC error naming what is wrong; nothing raises.
"""

from __future__ import annotations

import logging
from typing import Any

from agentrl.envs.server import wire
from agentrl.envs.server.session_table import Held, SessionCapacityError, SessionLookupError, SessionTable

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000

SESSION_CREATE = "openenv/session/create"
SESSION_CLOSE = "openenv/session/close"
TOOLS_LIST = "tools/list"
TOOLS_CALL = "tools/call"

_KEYS = frozenset({"jsonrpc", "method", "params", "id"})
# An id a peer in any language can hold: a 64-bit integer, or a string no longer than this.
MAX_ID_CHARS = 1024
_INT64 = 2**63


def _bad_id(rid: Any) -> bool:
    if rid is None:
        return False
    if isinstance(rid, str):
        return len(rid) > MAX_ID_CHARS
    # bool is an int to Python, not to JSON-RPC; fractional ids are refused, as OpenEnv's model does.
    return isinstance(rid, bool) or not isinstance(rid, int) or not -_INT64 <= rid < _INT64


def parse(request: Any) -> tuple[Any, str, dict[str, Any]] | dict[str, Any]:
    """(id, method, params) of a well-formed request, else the error reply (id null when the id is unusable)."""
    if not isinstance(request, dict):
        return wire.jsonrpc_error(None, INVALID_REQUEST, "Invalid request: a JSON-RPC request is a JSON object "
                                                         "(batches are not supported)")
    rid = request.get("id")
    if _bad_id(rid):
        return wire.jsonrpc_error(None, INVALID_REQUEST, "Invalid request: the id must be a string of at most "
                                                         f"{MAX_ID_CHARS} characters, a 64-bit integer or null")
    extra = sorted(str(k)[:40] for k in request.keys() - _KEYS)
    if extra:
        return wire.jsonrpc_error(rid, INVALID_REQUEST, f"Invalid request: unknown keys {', '.join(extra)}")
    method, params = request.get("method"), request.get("params", {})
    if request.get("jsonrpc") != "2.0" or not isinstance(method, str):
        return wire.jsonrpc_error(rid, INVALID_REQUEST, "Invalid request: needs jsonrpc '2.0' and a method name")
    if not isinstance(params, dict):
        return wire.jsonrpc_error(rid, INVALID_REQUEST, "Invalid request: params must be an object")
    return rid, method, params


def parse_text(text: str) -> tuple[Any, str, dict[str, Any]] | dict[str, Any]:
    """`parse` of a request's JSON text; a parse error reply for text that is not strict JSON."""
    try:
        request = wire.loads(text)
    except ValueError as exc:
        return wire.jsonrpc_error(None, PARSE_ERROR, f"Parse error: {exc}")
    return parse(request)


async def handle(table: SessionTable, request: Any, *, own: Held | None = None) -> dict[str, Any]:
    """The reply to one request. `own`: the session of the WebSocket it came over (whose lock the caller
    holds); None over HTTP, where `params.session_id` names the session."""
    parsed = parse(request)
    if isinstance(parsed, dict):
        return parsed
    return await answer(table, *parsed, own=own)


async def answer(table: SessionTable, rid: Any, method: str, params: dict[str, Any], *,
                 own: Held | None = None) -> dict[str, Any]:
    """The reply to a parsed request."""
    try:
        return await _answer(table, rid, method, params, own)
    except SessionLookupError as exc:
        return wire.jsonrpc_error(rid, INVALID_PARAMS, str(exc))
    except Exception as exc:  # a bug or an episode's failure: the client hears it, the server lives on
        log.exception("JSON-RPC %s failed", method[:60])
        return wire.jsonrpc_error(rid, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


async def _answer(table: SessionTable, rid: Any, method: str, params: dict[str, Any],
                  own: Held | None) -> dict[str, Any]:
    if method == SESSION_CREATE:
        if own is not None:  # a WebSocket's session is the one it is on
            return wire.jsonrpc_result(rid, {"session_id": own.id})
        try:
            held = table.create(pinned=False)
        except SessionCapacityError as exc:
            data = {"active_sessions": exc.active, "max_sessions": exc.maximum}
            return wire.jsonrpc_error(rid, SERVER_ERROR, str(exc), data)
        return wire.jsonrpc_result(rid, {"session_id": held.id})
    if method == SESSION_CLOSE:
        sid = params.get("session_id")
        if not sid:
            return wire.jsonrpc_error(rid, INVALID_PARAMS, "Invalid params - 'session_id' is required")
        if own is not None and sid == own.id:
            return wire.jsonrpc_error(rid, INVALID_REQUEST,
                                      "Cannot close active WebSocket-managed session via MCP method")
        return wire.jsonrpc_result(rid, await table.close(sid))
    if method not in (TOOLS_LIST, TOOLS_CALL):
        return wire.jsonrpc_error(rid, METHOD_NOT_FOUND, f"Method not found: {method[:200]}")
    if method == TOOLS_CALL:
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not name:
            return wire.jsonrpc_error(rid, INVALID_PARAMS, "Missing 'name' in params")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return wire.jsonrpc_error(rid, INVALID_PARAMS, "'arguments' must be an object")
    if own is not None:
        held = own
    else:
        if "session_id" not in params:
            return wire.jsonrpc_error(rid, INVALID_PARAMS, "Invalid params - 'session_id' is required: "
                                                           f"open one with {SESSION_CREATE}")
        held = table.get(params["session_id"])
    if held is own:  # the caller holds a WebSocket session's lock
        held.touch()
        return await _tools(rid, held, method, params)
    async with held.lock:
        if held.gone:  # closed or expired while this request waited for the lock
            raise SessionLookupError(f"Unknown session_id: {held.id}")
        held.touch()
        try:
            return await _tools(rid, held, method, params)
        finally:
            held.touch()


async def _tools(rid: Any, held: Held, method: str, params: dict[str, Any]) -> dict[str, Any]:
    session = held.session
    if method == TOOLS_LIST:
        tools = session.list_tools()["observation"]["tools"]
        listed = [{"name": t["name"], "description": t["description"], "inputSchema": t["input_schema"]} for t in tools]
        return wire.jsonrpc_result(rid, {"tools": listed})
    data = await session.call_tool(params["name"], params.get("arguments") or {})
    # OpenEnv 0.10 answers a step-based env's tools/call with the whole CallToolObservation; its MCP envs raise a
    # failed tool as an error (-32603). Both here: the error carries the observation, and `data` (what
    # MCPToolClient.call_tool returns) is the tool's value while the episode goes on; the call that ends the
    # episode has none, so call_tool returns the whole observation with its reward and scores.
    obs = data["observation"]
    full = {**obs, "reward": data["reward"], "done": data["done"]}
    meta = obs.get("metadata") or {}
    if obs.get("error") or meta.get("status") == "error":
        error = obs.get("error") or {"error_type": meta.get("failure", "error"), "message": meta.get("error", "")}
        return wire.jsonrpc_error(rid, INTERNAL_ERROR, f"{error['error_type']}: {error['message']}", full)
    result = obs.get("result")
    if not data["done"] and isinstance(result, dict) and "data" in result:
        full["data"] = result["data"]
    return wire.jsonrpc_result(rid, full)
