"""The sandbox interface the env server deploys episodes through."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from agentrl.envs.task import ToolResult, Turn


class SandboxError(RuntimeError):
    """The sandbox failed: a deploy that did not finish, a container that died, a lost worker."""


class EpisodeHandle(ABC):
    """An async facade over one live episode, wherever it runs. Methods never block the event loop."""

    task_id: str

    @abstractmethod
    async def first_turn(self) -> Turn: ...

    @abstractmethod
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...

    @abstractmethod
    async def end_turn(self, response: str) -> Turn | None: ...

    @abstractmethod
    async def done(self) -> bool: ...

    @abstractmethod
    async def scores(self) -> dict[str, float]: ...

    @abstractmethod
    async def close(self) -> None:
        """Tear the episode down (remove its container). Idempotent; never raises."""


class Sandbox(ABC):
    """Deploys episodes of one bundle. One per server."""

    @abstractmethod
    async def start(self) -> None:
        """Called once at server startup (clean up leftovers of a dead instance, fill a warm pool)."""

    @abstractmethod
    async def deploy(self, split: str, index: int) -> EpisodeHandle:
        """Start an episode of task `index` of `split`; raises SandboxError when deploying fails."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Tear every live episode down, then release the sandbox's resources."""

    async def health(self) -> dict[str, Any]:
        """The sandbox's state for the server's `/health`: `status` is "healthy" or "unhealthy" (then `error`
        says why), plus whatever helps an operator. Cheap enough to poll; never raises."""
        return {"status": "healthy"}
