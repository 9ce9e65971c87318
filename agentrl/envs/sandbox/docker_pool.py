"""The Docker sandbox's warm pool: containers started ahead of time, their bundle already loaded, each waiting to
be given one episode. A deploy that finds one skips the container start and the bundle load.

The pool belongs to one sandbox (a `ContainerHost`) and starts and removes containers through it; its warming
tasks are the sandbox's background tasks, so shutdown cancels them with everything else.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from agentrl.envs.sandbox.base import SandboxError
from agentrl.envs.sandbox.docker_support import Box, ContainerHost, Lost, RemoteError

log = logging.getLogger(__name__)


class WarmPool:
    """Keeps up to `size` fresh containers of `sandbox` ready."""

    def __init__(self, sandbox: ContainerHost, size: int) -> None:
        self._sandbox, self.size = sandbox, size
        self._ready: collections.deque[Box] = collections.deque()
        self._warming: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._ready)

    async def fill(self) -> None:
        """Start the whole pool and wait until each container is ready or has failed."""
        self.refill()
        await asyncio.gather(*list(self._warming), return_exceptions=True)

    def refill(self) -> None:
        """Start containers in the background until ready plus warming reaches `size`."""
        while not self._sandbox.closing and len(self._ready) + len(self._warming) < self.size:
            task = self._sandbox.spawn(self._warm_one())
            self._warming.add(task)
            task.add_done_callback(self._warming.discard)

    async def _warm_one(self) -> None:
        try:
            box = await self._sandbox.launch(warm=True)
            if self._sandbox.closing:
                await self._sandbox.remove(box)
            else:
                self._ready.append(box)
        except Exception as exc:  # the next deploy starts a cold container and tries to refill again
            log.warning("starting a warm container failed: %s", exc)
        finally:
            # Counted out now, not when the task is done, so a refill right after sees the box as ready only.
            self._warming.discard(asyncio.current_task())  # type: ignore[arg-type]

    async def assign(self, split: str, index: int) -> tuple[Box, str] | None:
        """Give task `index` of `split` to a ready container: (its box, the task id), or None when none is left."""
        while self._ready:
            box = self._ready.popleft()
            self.refill()
            try:
                task_id = await box.channel.request("episode", split=split, index=index)
            except Lost:
                self._sandbox.remove_later(box)  # died while waiting; try the next one
                continue
            except RemoteError as exc:
                self._ready.appendleft(box)  # no episode was made: the container is still fresh
                raise SandboxError(f"deploying {split}[{index}] failed: {exc}") from None
            except BaseException:  # cancelled mid-assignment: the channel is no longer trustworthy
                self._sandbox.remove_later(box)
                raise
            return box, task_id["task_id"]
        return None
