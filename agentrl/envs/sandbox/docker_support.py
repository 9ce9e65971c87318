"""Host-side plumbing of the Docker sandbox: who owns a container (labels), the JSON-lines channel, and the
blocking Docker API calls the sandbox runs on its thread pool.

The wire itself (one JSON object per line, `{"op": ...}` in, `{"ok": ..., "result"|"error": ...}` out) is described
in `container_agent.py`, the other end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LABEL = "agentrl.sandbox"


def proc_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot), or None when no such process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_alive(labels: dict[str, str], hostname: str | None = None) -> bool:
    """Whether the server that labelled a container may still be running. Containers made on another host
    (or with unreadable labels) count as alive: we cannot tell, so we never touch them."""
    if labels.get("agentrl.host") != (hostname or socket.gethostname()):
        return True
    try:
        pid = int(labels["agentrl.pid"])
    except (KeyError, ValueError):
        return True
    start = proc_start(pid)
    if start is None:
        return False
    return labels.get("agentrl.pid_start") in (None, start)


def owner_labels(instance_id: str, bundle: str) -> dict[str, str]:
    """The labels that tie a new container to this process and sandbox instance (read by `owner_alive`)."""
    pid = os.getpid()
    return {LABEL: "1", "agentrl.instance": instance_id, "agentrl.pid": str(pid),
            "agentrl.pid_start": proc_start(pid) or "", "agentrl.host": socket.gethostname(),
            "agentrl.bundle": bundle}


class Lost(Exception):
    """The connection to a container broke (it died, was killed, or did not answer in time)."""

    def __init__(self, reason: str, still_running: bool = False) -> None:
        super().__init__(reason)
        self.still_running = still_running  # we gave up on it (timeout, cancelled call): no exit to wait for


class RemoteError(Exception):
    """The code inside the container raised; the container itself is fine."""


class Channel:
    """One request at a time over the container's socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
        self.reader, self.writer, self.timeout = reader, writer, timeout
        self.lost: str | None = None
        self._gave_up = False
        self._lock = asyncio.Lock()

    async def request(self, op: str, **kwargs: Any) -> Any:
        async with self._lock:
            if self.lost:
                raise Lost(self.lost, self._gave_up)
            try:
                self.writer.write(json.dumps({"op": op, **kwargs}).encode() + b"\n")
                await self.writer.drain()
                line = await asyncio.wait_for(self.reader.readline(), self.timeout)
            except TimeoutError:
                self.lost, self._gave_up = f"no answer to {op!r} within {self.timeout:g}s", True
                raise Lost(self.lost, True) from None
            except asyncio.CancelledError:
                # Its answer may still come and would be read as the next call's: the channel is unusable.
                self.lost, self._gave_up = f"the call {op!r} was cancelled before it answered", True
                raise
            except (OSError, ValueError) as exc:  # ValueError: a line over the limit
                self.lost = f"connection lost ({exc})"
                raise Lost(self.lost) from None
            if not line.endswith(b"\n"):
                self.lost = "connection closed"
                raise Lost(self.lost)
            try:
                msg = json.loads(line)
            except ValueError:
                self.lost = f"a garbled answer to {op!r}: {line[:200]!r}"
                raise Lost(self.lost) from None
            if not msg.get("ok"):
                raise RemoteError(msg.get("error", "unknown error"))
            return msg.get("result")

    def close(self) -> None:
        self.lost = self.lost or "closed"
        self.writer.close()


# -- blocking Docker API helpers (run on the sandbox's thread pool) ---------------------------------------------


def container_state(api: Any, name: str) -> dict[str, Any]:
    """The container's `State` from inspect, or {"Status": "removed"} when it is gone."""
    try:
        return api.inspect_container(name)["State"]
    except Exception:
        return {"Status": "removed"}


def death_reason(api: Any, name: str, fallback: str, memory: str) -> str:
    """Why a container stopped answering: its exit code, OOM flag and last stderr lines."""
    try:
        # The socket can close a moment before Docker records the exit.
        code = api.wait(name, timeout=3)["StatusCode"]
    except Exception:
        state = container_state(api, name)
        if state.get("Status") == "removed":
            return f"the container was removed ({fallback})"
        if state.get("Status") in ("created", "running"):
            return fallback
        code = state.get("ExitCode", "?")
    parts = [f"exit code {code}"]
    if container_state(api, name).get("OOMKilled"):
        parts.append(f"out of memory (limit {memory})")
    elif code == 137:
        parts.append("killed")
    try:
        tail = api.logs(name, stdout=False, stderr=True, tail=5).decode(errors="replace").strip()
    except Exception:
        tail = ""
    return ", ".join(parts) + (f"; stderr: {tail}" if tail else "") + f" ({fallback})"


def remove_container(api: Any, name: str) -> None:
    """Kill and remove a container; one already gone (or being removed) is fine."""
    import docker

    try:
        api.remove_container(name, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise


def remove_orphans(api: Any, instance_id: str) -> int:
    """Remove sandbox containers whose owning server is gone, sparing `instance_id`'s; returns how many."""
    removed = 0
    for c in api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        labels = c.get("Labels") or {}
        if labels.get("agentrl.instance") == instance_id or owner_alive(labels):
            continue
        try:
            api.remove_container(c["Id"], force=True)
            removed += 1
        except Exception as exc:  # already gone, or being removed by someone else
            log.debug("could not remove leftover %s: %s", c["Id"][:12], exc)
    return removed


def remove_instance(api: Any, instance_id: str) -> None:
    """Remove every container labelled with `instance_id`, whatever state it is in."""
    for c in api.containers(all=True, filters={"label": f"agentrl.instance={instance_id}"}):
        try:
            api.remove_container(c["Id"], force=True)
        except Exception as exc:
            log.debug("sweep could not remove %s: %s", c["Id"][:12], exc)
