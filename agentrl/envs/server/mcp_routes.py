"""The `/mcp` routes of OpenEnv 0.10's production mode: JSON-RPC over HTTP POST and over a WebSocket.

The bearer token, capacity and the tool timeout apply as on `/ws` (the middleware, the session table and
the session itself enforce them); a request body is capped at `MAX_BODY_BYTES`, like a `/ws` frame.
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from agentrl.envs.server import mcp_rpc, wire
from agentrl.envs.server.session_table import SessionCapacityError, SessionTable
from agentrl.uvicorn_servers import BodyTooLarge, ClientGone, read_body

log = logging.getLogger(__name__)

# Uvicorn's cap on a WebSocket message, so `/mcp` over HTTP takes what `/ws` takes.
MAX_BODY_BYTES = 16 * 1024 * 1024


def _reply(body: dict, status: int = 200, *, close: bool = False) -> Response:
    # close: the connection may hold a body past the drain bound, which must not be read as a next request
    headers = {"connection": "close"} if close else None
    return Response(wire.dumps(body), status_code=status, media_type="application/json", headers=headers)


async def _body(request: Request) -> bytes | None:
    """The request body, or None once it passes MAX_BODY_BYTES (the rest read and dropped up to a bound, so that
    the client, done sending, reads the 413; see `uvicorn_servers.read_body`)."""
    try:
        return await read_body(request.receive, request.scope.get("headers"), MAX_BODY_BYTES)
    except BodyTooLarge:
        return None
    except ClientGone:
        raise ClientDisconnect() from None


def add_mcp_routes(app: FastAPI, table: SessionTable) -> None:
    """`POST /mcp` and the `/mcp` WebSocket, answering against `table`'s sessions."""

    @app.post("/mcp", responses={413: {"description": "the body is over 16 MiB"}})
    async def mcp_http(request: Request) -> Response:
        """One JSON-RPC request: `openenv/session/create`, `openenv/session/close`, and `tools/list` /
        `tools/call` on the session named in `params.session_id`. Errors are JSON-RPC errors (HTTP 200)."""
        body = await _body(request)
        if body is None:
            error = wire.jsonrpc_error(None, mcp_rpc.INVALID_REQUEST, f"the body is over {MAX_BODY_BYTES} bytes")
            return _reply(error, 413, close=True)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _reply(wire.jsonrpc_error(None, mcp_rpc.PARSE_ERROR, f"Parse error: {exc}"))
        parsed = mcp_rpc.parse_text(text)
        if isinstance(parsed, dict):
            return _reply(parsed)
        return _reply(await mcp_rpc.answer(table, *parsed))

    @app.websocket("/mcp")
    async def mcp_ws(websocket: WebSocket) -> None:
        """JSON-RPC frames against a session of this connection's own, ended when it closes."""
        await websocket.accept()
        try:
            held = table.create(pinned=True)
        except SessionCapacityError as exc:
            data = {"active_sessions": exc.active, "max_sessions": exc.maximum}
            await websocket.send_text(wire.dumps(wire.jsonrpc_error(None, mcp_rpc.SERVER_ERROR, str(exc), data)))
            await websocket.close(1000)
            return
        try:
            while True:
                try:
                    text = await wire.receive_text(websocket)
                except UnicodeDecodeError as exc:
                    error = wire.jsonrpc_error(None, mcp_rpc.PARSE_ERROR, f"Parse error: {exc}")
                    await websocket.send_text(wire.dumps(error))
                    continue
                if text is None:
                    break
                parsed = mcp_rpc.parse_text(text)
                if not isinstance(parsed, dict):
                    async with held.lock:
                        held.touch()
                        parsed = await mcp_rpc.answer(table, *parsed, own=held)
                await websocket.send_text(wire.dumps(parsed))
        except Exception as exc:  # a lost connection mid-send, or a bug: end the session either way
            log.debug("/mcp session ended: %r", exc)
        finally:
            await table.release(held, attached=False)
        with contextlib.suppress(Exception):
            await websocket.close(1000)

