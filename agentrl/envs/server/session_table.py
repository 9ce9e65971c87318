"""Every live session of one server by id: who holds it, and when it expires.

A session is created by a `/ws` or `/mcp` WebSocket (which holds it until it closes) or by JSON-RPC
`openenv/session/create` over HTTP `/mcp` (OpenEnv 0.10's production mode), which nothing holds: a
`/ws?session_id=` may join it, `openenv/session/close` ends it, and if neither happens it expires after
`idle_timeout` seconds without a message, so a client that vanishes leaks nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field

from agentrl.envs.server.session import Served, Session

log = logging.getLogger(__name__)


class SessionCapacityError(RuntimeError):
    """No room for another session."""

    def __init__(self, active: int, maximum: int) -> None:
        super().__init__(
            f"Server at capacity: {active}/{maximum} sessions active. Cannot accept new connections."
        )
        self.active, self.maximum = active, maximum


class SessionLookupError(RuntimeError):
    """A session id that names no session this server has, or one that cannot be joined."""


@dataclass(eq=False)
class Held:
    """One session and who holds it."""

    id: str
    session: Session
    last_active: float
    # Serializes the session's messages: an HTTP `tools/call` and the joined WebSocket share the episode.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pinned: bool = False  # the WebSocket that created it is still open
    attached: bool = False  # a `/ws?session_id=` has joined it
    closing: bool = False  # close was asked while held: it ends when the last holder leaves
    gone: bool = False

    def touch(self) -> None:
        self.last_active = time.monotonic()


def _short(sid: object) -> str:
    text = str(sid)
    return text if len(text) <= 80 else f"{text[:80]}..."


class SessionTable:
    """The sessions of one server; their slots count against `max_sessions` until torn down."""

    def __init__(self, served: Served, *, max_sessions: int, idle_timeout: float) -> None:
        self.served = served
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self._by_id: dict[str, Held] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def create(self, *, pinned: bool) -> Held:
        """A new session (SessionCapacityError when the server is full). No await: the check and the add
        cannot interleave with another create."""
        active = len(self.served.sessions)
        if active >= self.max_sessions:
            raise SessionCapacityError(active, self.max_sessions)
        held = Held(id=uuid.uuid4().hex, session=Session(self.served), last_active=time.monotonic(), pinned=pinned)
        self._by_id[held.id] = held
        self.served.sessions.add(held.session)
        return held

    def get(self, sid: object) -> Held:
        """The session named `sid`; SessionLookupError naming it when there is none."""
        held = self._by_id.get(sid) if isinstance(sid, str) else None
        if held is None:
            raise SessionLookupError(f"Unknown session_id: {_short(sid)}")
        return held

    def attach(self, sid: str) -> Held:
        """Join a WebSocket to the session `sid` (at most one at a time)."""
        held = self.get(sid)
        if held.attached:
            raise SessionLookupError(f"Session {_short(sid)} already has an attached WebSocket")
        if held.closing:
            raise SessionLookupError(f"Session {_short(sid)} is closing")
        held.attached = True
        held.touch()
        return held

    async def release(self, held: Held, *, attached: bool) -> None:
        """A holding WebSocket left. The creator's leaving ends the session (as a `/ws` always did); a joined
        one's leaving keeps it for its creator's `openenv/session/close` (or expiry), unless close was asked."""
        if attached:
            held.attached = False
        else:
            held.pinned = False
            held.closing = True
        held.touch()
        if held.closing and not held.attached and not held.pinned:
            await self.destroy(held)

    async def close(self, sid: object) -> dict[str, object]:
        """`openenv/session/close`: end it now, or once its WebSocket leaves (`closing`)."""
        held = self.get(sid)
        if held.attached or held.pinned:
            held.closing = True
            return {"session_id": held.id, "closed": False, "closing": True}
        await self.destroy(held)
        return {"session_id": held.id, "closed": True}

    async def destroy(self, held: Held) -> None:
        """Tear the session down; its slot stays taken until its episode is gone."""
        if held.gone:
            return
        held.gone = True
        self._by_id.pop(held.id, None)
        try:
            async with held.lock:  # a call in flight finishes first (bounded by the tool timeout)
                await held.session.close()
        finally:
            self.served.sessions.discard(held.session)

    async def reap(self) -> int:
        """End every session nobody holds that has been idle longer than `idle_timeout`; how many."""
        now = time.monotonic()
        stale = [h for h in self._by_id.values()
                 if not (h.pinned or h.attached) and now - h.last_active > self.idle_timeout]
        for held in stale:
            log.info("session %s expired after %.0fs idle", held.id, now - held.last_active)
            await self.destroy(held)
        return len(stale)

    async def reap_forever(self) -> None:
        """`reap` every quarter of the idle timeout (at least every 30 s), until cancelled."""
        interval = min(max(self.idle_timeout / 4, 0.01), 30.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap()
            except Exception:  # one failed teardown must not stop expiry for the rest
                log.exception("expiring idle sessions failed")

    async def close_all(self) -> None:
        """Shutdown: every session ends, held or not."""
        for held in list(self._by_id.values()):
            with contextlib.suppress(Exception):
                await self.destroy(held)
