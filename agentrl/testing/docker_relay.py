"""`DaemonRelay`: a unix socket that relays to the real Docker daemon's, and can go away or freeze on demand.

Pointing DOCKER_HOST at the relay lets a test or benchmark give the Docker sandbox a daemon that stops (the socket
disappears: connections refused) or freezes (the socket still accepts, nothing answers: what a dockerd under
SIGSTOP looks like), while the real daemon keeps running for everyone else on the machine.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any


def default_daemon_socket() -> str:
    """The real daemon's unix socket path (from DOCKER_HOST when it names one)."""
    return (os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock").removeprefix("unix://")


class DaemonRelay:
    """Relays `path` to the daemon socket `target` on its own thread. `stop()`/`start()`: the daemon goes away and
    comes back; `freeze()`/`thaw()`: it stops answering (requests are accepted and held) and resumes (what was
    held is delivered, as after SIGCONT)."""

    def __init__(self, path: Path, target: str | None = None) -> None:
        self.path, self.target = Path(path), target or default_daemon_socket()
        self.address = f"unix://{self.path}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="docker-relay")
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thawed = asyncio.Event()
        self._do(self._set_thawed(True))

    def _do(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _set_thawed(self, thawed: bool) -> None:
        if thawed:
            self._thawed.set()
        else:
            self._thawed.clear()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                await self._thawed.wait()  # frozen: hold the bytes, as the kernel does for a stopped process
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._thawed.wait()
            up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        except OSError:
            writer.close()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}

    def start(self) -> None:
        """Listen at `path` (the daemon is back)."""

        async def start() -> None:
            self._server = await asyncio.start_unix_server(self._relay, path=str(self.path))

        self._do(start())

    def stop(self) -> None:
        """Stop listening and drop every connection (the daemon is gone)."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            for w in self._writers:
                w.close()
            self._writers.clear()
            self.path.unlink(missing_ok=True)

        self._do(stop())

    def freeze(self) -> None:
        """Keep accepting, answer nothing: the daemon is frozen (SIGSTOP)."""
        self._do(self._set_thawed(False))

    def thaw(self) -> None:
        """Deliver what was held and relay again (SIGCONT)."""
        self._do(self._set_thawed(True))

    def close(self) -> None:
        """Stop relaying and end the relay's thread."""
        self.thaw()
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
