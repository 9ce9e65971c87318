"""A request body limit that answers like the rest of the session API: 413 `{"error": ...}`.

FastAPI's own limiter answers in its own format; this ASGI middleware reads the body itself, keeps
at most `max_bytes` of it and hands the app the bytes it read. A larger body is read on and dropped
(up to `uvicorn_servers.DRAIN_BYTES` more) before the 413 goes out, so a client that sends its whole body
before reading (Python's http.client) reads the 413 rather than a reset connection.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.config.inference import InferenceConfig
from agentrl.uvicorn_servers import BodyTooLarge, ClientGone, read_body

MAX_BODY_BYTES: int = InferenceConfig.max_body_bytes


class BodyLimit:
    """ASGI middleware: an HTTP request body over `max_bytes` gets 413 and never reaches `app`."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(receive, scope.get("headers"), self.max_bytes)
        except ClientGone:
            return
        except BodyTooLarge as exc:
            await self._refuse(send, exc.declared)
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()  # after the body: the disconnect, whenever it comes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, declared: int | None) -> None:
        size = f"{declared} bytes" if declared is not None else "more bytes than that"
        payload = json.dumps({"error": f"the request body is over the server's limit of {self.max_bytes} bytes "
                                       f"(it has {size}; inference.max_body_bytes sets the limit)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})
