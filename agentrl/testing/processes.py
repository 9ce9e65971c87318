"""Waiting for a server started as a child process (tests and benchmarks start env servers this way)."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 60.0) -> None:
    """Return once `GET {url}/health` answers 200; raise RuntimeError with the server's stderr tail if the
    process exits first, or when `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"server exited with {proc.returncode}: {(err or '')[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never became healthy in {timeout:.0f} s")
