"""The Docker sandbox's episode handle: one episode's calls over its container's channel, and what a dead
container turns them into (a SandboxError that says why it died: exit code, OOM, last stderr lines).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentrl.envs.sandbox.base import EpisodeHandle, SandboxError
from agentrl.envs.sandbox.docker_support import Box, ContainerHost, Lost, RemoteError
from agentrl.envs.task import ToolResult, Turn

log = logging.getLogger(__name__)


class DockerEpisodeHandle(EpisodeHandle):
    """One episode in one container. A dead container makes every call raise SandboxError."""

    def __init__(self, sandbox: ContainerHost, box: Box, task_id: str) -> None:
        self._sandbox, self._box, self.task_id = sandbox, box, task_id
        self.container_name = box.name
        self._closed = False
        self._dead: str | None = None

    async def _call(self, op: str, **kwargs: Any) -> Any:
        if self._closed:
            raise SandboxError(f"episode {self.task_id!r} was closed")
        if self._sandbox.closing:
            raise SandboxError("the docker sandbox shut down")
        if self._dead:
            raise SandboxError(self._dead)
        try:
            return await self._box.channel.request(op, **kwargs)
        except asyncio.CancelledError:  # e.g. the server's tool timeout: this container cannot be trusted now
            if not self._closed and self._box.channel.lost:
                self._dead = f"the episode's container died: {self._box.channel.lost} (killed)"
                self._sandbox.remove_later(self._box)
            raise
        except Lost as exc:
            if self._closed:
                raise SandboxError(f"episode {self.task_id!r} was closed") from None
            try:
                reason = (f"{exc} (killed)" if exc.still_running
                          else await self._sandbox.death_reason(self._box.name, str(exc)))
            except Exception:  # the sandbox is shutting down under us
                reason = str(exc)
            self._dead = f"the episode's container died: {reason}"
            self._sandbox.remove_later(self._box)
            raise SandboxError(self._dead) from None
        except RemoteError as exc:
            raise SandboxError(f"episode {self.task_id!r} raised in its container: {exc}") from None

    async def first_turn(self) -> Turn:
        return Turn(**await self._call("first_turn"))

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(**await self._call("call_tool", name=name, arguments=arguments))

    async def end_turn(self, response: str) -> Turn | None:
        turn = await self._call("end_turn", response=response)
        return None if turn is None else Turn(**turn)

    async def done(self) -> bool:
        return bool(await self._call("done"))

    async def scores(self) -> dict[str, float]:
        return dict(await self._call("scores"))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._sandbox.remove(self._box)
        except Exception:  # close never raises; shutdown's sweep by label catches anything left
            log.exception("removing container %s failed", self._box.name)
