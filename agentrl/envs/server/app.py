"""`build_app`: a FastAPI app that serves a bundle over the OpenEnv protocol: 0.3's `/ws` sessions and 0.10's
production mode (`/mcp` JSON-RPC, a `/ws` joined to an `/mcp` session by `?session_id=`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from agentrl.config.env import RESET_TIMEOUT_S, SESSION_IDLE_TIMEOUT_S, TOOL_TIMEOUT_S
from agentrl.envs.sandbox.base import Sandbox
from agentrl.envs.server import mcp_rpc, wire
from agentrl.envs.server.mcp_routes import add_mcp_routes
from agentrl.envs.server.session import Served, make_reward
from agentrl.envs.server.session_table import Held, SessionCapacityError, SessionLookupError, SessionTable
from agentrl.envs.task import Bundle

log = logging.getLogger(__name__)


class BearerAuth:
    """ASGI middleware: every HTTP request and WebSocket but `/health` must carry the bearer token.

    A refused WebSocket is accepted and closed at once with 1008 (policy violation), before the app
    sees it, so nothing is ever deployed for it.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    def _authorized(self, scope: Scope) -> bool:
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                return hmac.compare_digest(value, self._expected)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope.get("path") == "/health" or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if kind == "http":
            body = b'{"detail":"the bearer token is missing or wrong"}'
            headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1008, "reason": "the bearer token is missing or wrong"})


def _field(config: Any, name: str, default: Any) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def make_sandbox(sandbox: str | Sandbox | Any, bundle: Bundle, *, workers: int, name: str | None = None) -> Sandbox:
    """A Sandbox from "local", "docker", a Sandbox instance, or a config (dict or object) with `kind`.
    `name` (default: the bundle's) starts a Docker sandbox's instance id, which is unique per process anyway."""
    if isinstance(sandbox, Sandbox):
        return sandbox
    config: Any = {"kind": sandbox} if isinstance(sandbox, str) else sandbox
    kind = _field(config, "kind", None)
    if kind == "local":
        from agentrl.envs.sandbox.local import LocalSandbox

        return LocalSandbox(bundle, workers=workers)
    if kind == "docker":
        from agentrl.config.sandbox import DockerSandboxConfig
        from agentrl.envs.sandbox.docker import DockerSandbox  # the Docker SDK loads only when asked

        defaults = DockerSandboxConfig()
        known = {f.name for f in dataclasses.fields(defaults)}
        unknown = sorted(set(config) - known) if isinstance(config, dict) else []
        if unknown:  # a misspelled setting must not fall back to its default unnoticed
            raise ValueError(f"unknown docker sandbox settings: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        opts = {name: _field(config, name, getattr(defaults, name)) for name in known}
        opts.pop("kind")
        return DockerSandbox(bundle.spec(), name=name or bundle.name, **opts)
    raise ValueError(f"sandbox must be 'local', 'docker', a Sandbox or a config with kind local/docker, not {sandbox!r}")


def build_app(
    bundle: Bundle,
    *,
    max_concurrent_envs: int = 8,
    token: str | None = None,
    reward: None | str | Callable[[dict[str, float]], float] = None,
    sandbox: str | Sandbox | Any = "local",
    tool_timeout: float = TOOL_TIMEOUT_S,
    reset_timeout: float = RESET_TIMEOUT_S,
    sandbox_name: str | None = None,
    session_idle_timeout: float = SESSION_IDLE_TIMEOUT_S,
) -> FastAPI:
    """A FastAPI app serving `bundle` over the OpenEnv protocol.

    `reward`: None (the episode's one score), a score name, or a callable(scores) -> float.
    `sandbox`: "local", "docker", a Sandbox instance, or a sandbox config (dict/object) with `kind`.
    `token`: when set, every request but `GET /health` needs `Authorization: Bearer <token>`.
    `sandbox_name`: a readable name for the sandbox's containers (e.g. `gridsim-8200`).
    `session_idle_timeout`: seconds a session made by `/mcp`'s `openenv/session/create` that no WebSocket holds
    may sit idle before it ends.
    """
    if max_concurrent_envs < 1:
        raise ValueError(f"max_concurrent_envs must be at least 1, not {max_concurrent_envs}")
    if tool_timeout <= 0 or reset_timeout <= 0 or not session_idle_timeout > 0:
        raise ValueError(f"timeouts must be positive (tool_timeout={tool_timeout}, reset_timeout={reset_timeout}, "
                         f"session_idle_timeout={session_idle_timeout})")
    if token is not None and (not isinstance(token, str) or not token):
        raise ValueError("token must be a non-empty string or None")
    bundle_splits = {str(k): int(v) for k, v in bundle.splits().items()}
    if "all" in bundle_splits:
        raise ValueError(f"bundle {bundle.name!r} names a split 'all'; the server adds that split itself")
    served = Served(
        bundle=bundle,
        sandbox=make_sandbox(sandbox, bundle, workers=min(max_concurrent_envs, 32), name=sandbox_name),
        reward=make_reward(reward),
        tool_timeout=float(tool_timeout),
        reset_timeout=float(reset_timeout),
        splits={"all": sum(bundle_splits.values()), **bundle_splits},
        order=list(bundle_splits),
    )
    table = SessionTable(served, max_sessions=max_concurrent_envs, idle_timeout=float(session_idle_timeout))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await served.sandbox.start()
        reaper = asyncio.ensure_future(table.reap_forever())
        try:
            yield
        finally:
            # Uvicorn shutdown (SIGTERM included): tear every live episode down, then the sandbox.
            reaper.cancel()
            await table.close_all()
            await asyncio.gather(*(s.close() for s in list(served.sessions)), return_exceptions=True)
            await served.sandbox.shutdown()

    app = FastAPI(title=f"agentrl env server: {bundle.name}", lifespan=lifespan)
    app.state.served = served
    app.state.sessions = table
    if token is not None:
        app.add_middleware(BearerAuth, token=token)

    @app.get("/health", responses={503: {"description": "the sandbox cannot deploy episodes"}})
    async def health() -> JSONResponse:
        """`{"status": "healthy"|"unhealthy", "sandbox": {...}}`; 503 when the sandbox cannot deploy episodes
        (e.g. the Docker daemon does not answer), so a poller that waits for 200 waits for a working server."""
        try:
            state = await served.sandbox.health()
        except Exception as exc:  # a sandbox's health() should not raise; report it rather than answer 500
            state = {"status": "unhealthy", "error": f"{type(exc).__name__}: {exc}"}
        healthy = state.get("status") == "healthy"
        body = {"status": "healthy" if healthy else "unhealthy", "sandbox": wire.json_safe(state)}
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return wire.schema()

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": bundle.name,
            "description": f"agentrl bundle {bundle.name!r} (splits: {', '.join(served.splits)})",
            "readme_content": None,
            "version": str(getattr(bundle, "version", "") or "") or None,
            "author": None,
            "documentation_url": None,
            # Not in OpenEnv's schema (its client ignores extra keys); the rows writer reads it.
            "splits": dict(served.splits),
        }

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        """OpenEnv's reset/step/state/close frames; `?session_id=` joins a session made over `/mcp`."""
        await websocket.accept()
        joined = websocket.query_params.get("session_id")
        try:
            held = table.attach(joined) if joined else table.create(pinned=True)
        except SessionCapacityError as exc:
            await websocket.send_text(wire.error_frame(wire.CAPACITY_REACHED, str(exc), active_sessions=exc.active,
                                                       max_sessions=exc.maximum))
            await websocket.close(1000)
            return
        except SessionLookupError as exc:
            await websocket.send_text(wire.error_frame(wire.SESSION_ERROR, str(exc)))
            await websocket.close(1000)
            return
        closed_by_client = False
        try:
            while True:
                try:
                    text = await wire.receive_text(websocket)
                except UnicodeDecodeError as exc:
                    await websocket.send_text(wire.error_frame(wire.INVALID_JSON, f"Invalid JSON: {exc}"))
                    continue
                if text is None:
                    break
                async with held.lock:
                    held.touch()
                    reply = await dispatch(held, text, table)
                if reply is None:
                    closed_by_client = True
                    break
                await websocket.send_text(reply)
        except Exception as exc:  # a lost connection mid-send, or a bug: end the session either way
            log.debug("session ended: %r", exc)
        finally:
            # The slot stays taken until the episode is torn down.
            await table.release(held, attached=bool(joined))
        if closed_by_client:
            with contextlib.suppress(Exception):
                await websocket.close(1000)

    add_mcp_routes(app, table)
    return app


async def dispatch(held: Held, text: str, table: SessionTable) -> str | None:
    """The reply frame to one client frame on `held`'s WebSocket; None for `close`. Never raises: whatever a
    frame holds, the client gets the protocol's error reply and the session lives on."""
    try:
        return await _dispatch(held, text, table)
    except Exception as exc:
        log.exception("handling a frame failed")
        return wire.error_frame(wire.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}")


async def _dispatch(held: Held, text: str, table: SessionTable) -> str | None:
    session = held.session
    try:
        msg = wire.loads(text)
    except ValueError as exc:
        return wire.error_frame(wire.INVALID_JSON, f"Invalid JSON: {exc}")
    if not isinstance(msg, dict):
        return wire.error_frame(wire.UNKNOWN_TYPE, "Unknown message type: a frame must be a JSON object")
    kind = msg.get("type")
    fast = _fast_call(msg) if kind == "step" else None
    if fast is not None:  # the common, well-formed tool call: skip pydantic
        try:
            return wire.observation_frame(await session.call_tool(*fast))
        except Exception as exc:
            log.exception("handling a step message failed")
            return wire.error_frame(wire.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}")
    model = wire.MESSAGES.get(kind) if isinstance(kind, str) else None
    if model is None:
        return wire.error_frame(wire.UNKNOWN_TYPE,
                                f"Unknown message type: {wire.clip(kind) if isinstance(kind, str) else ''}")
    try:
        parsed = model.model_validate(msg)
        if kind == "step":
            action = wire.parse_action(parsed.data)
            if isinstance(action, wire.ListToolsAction):
                return wire.observation_frame(session.list_tools())
            return wire.observation_frame(await session.call_tool(action.tool_name, action.arguments))
        if kind == "reset":
            return wire.observation_frame(await session.reset(wire.ResetData.model_validate(parsed.data)))
        if kind == "state":
            return wire.dumps({"type": "state", "data": session.state()})
        if kind == "close":
            return None
        return wire.dumps({"type": "mcp", "data": await mcp_rpc.handle(table, parsed.data, own=held)})
    except ValidationError as exc:
        return wire.validation_error_frame(exc)
    except Exception as exc:
        log.exception("handling a %s message failed", kind)
        return wire.error_frame(wire.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}")


_CALL_KEYS = frozenset({"type", "tool_name", "arguments", "metadata"})


def _fast_call(msg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(tool name, arguments) of a step frame that certainly validates as a call_tool; else None."""
    if len(msg) != 2:
        return None
    data = msg.get("data")
    if type(data) is not dict or not data.keys() <= _CALL_KEYS or data.get("type", "call_tool") != "call_tool":
        return None
    name, arguments = data.get("tool_name"), data.get("arguments", {})
    if type(name) is not str or type(arguments) is not dict or type(data.get("metadata", {})) is not dict:
        return None
    return name, arguments
