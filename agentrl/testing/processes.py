"""Waiting for a server started as a child process (tests and benchmarks start env servers this way)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 60.0, *, log: Path | None = None,
                 poll: float = 0.1) -> None:
    """Return once `GET {url}/health` answers 200; raise RuntimeError with the server's output tail (its
    stderr pipe, or `log` when its output goes to that file) if the process exits first, or when `timeout`
    seconds pass."""

    def tail() -> str:
        if log is not None:
            return log.read_text()[-3000:]
        return (proc.stderr.read() if proc.stderr else "")[-3000:] if proc.poll() is not None else ""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {proc.returncode}: {tail() or ''}")
        try:
            if httpx.get(f"{url}/health", timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    raise RuntimeError(f"{url} never became healthy in {timeout:.0f} s: {tail()}")
