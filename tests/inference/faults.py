"""Fault injection for the session server's lifecycle tests: the real engine, broken on cue.

`FaultyEngine` is `EmbeddedEngine` (importable by Hydra as `faults.FaultyEngine` with this folder
on PYTHONPATH) whose prompt text can hold a trigger:

* CRASH_WORKER: the worker raises while prefilling it (as a CUDA fault would), but only once
  `CRASH_AFTER_QUEUED` more requests wait in its queue (or 60 s passed), so a test knows that
  requests were pending when it died.
* WEDGE_WORKER: the worker blocks forever in that prefill (a hung device).
* WEDGE_LOOP: `generate` blocks the server's event loop thread forever (a handler stuck in sync code).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from agentrl.inference.engines.embedded.engine import EmbeddedEngine

CRASH_WORKER = "CRASH-WORKER"
WEDGE_WORKER = "WEDGE-WORKER"
WEDGE_LOOP = "WEDGE-LOOP"
CRASH_AFTER_QUEUED = 2
INJECTED = "injected fault: CUDA error: an illegal memory access was encountered"


class FaultyEngine(EmbeddedEngine):
    """EmbeddedEngine that crashes or wedges when a prompt holds a trigger word."""

    def _prefill(self, reqs: list[Any]) -> None:
        text = "".join(self.tokenizer.decode(r.prompt_ids) for r in reqs)
        if CRASH_WORKER in text:
            deadline = time.monotonic() + 60
            while self._queue.qsize() < CRASH_AFTER_QUEUED and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RuntimeError(INJECTED)
        if WEDGE_WORKER in text:
            threading.Event().wait()
        super()._prefill(reqs)

    async def generate(self, prompt_ids: list[int], **kwargs: Any) -> Any:
        if WEDGE_LOOP in self.tokenizer.decode(prompt_ids):
            while True:
                time.sleep(3600)  # noqa: ASYNC251 - blocking the loop is the fault
        return await super().generate(prompt_ids, **kwargs)
