"""Host-side plumbing of the Docker sandbox: who owns a container (labels), the JSON-lines channel, what the
episode handle and warm pool need from the sandbox (`ContainerHost`), and the blocking Docker API calls the
sandbox runs on its thread pool.

The wire itself (one JSON object per line, `{"op": ...}` in, `{"ok": ..., "result"|"error": ...}` out) is described
in `container_agent.py`, the other end. Imports go one way: `docker.py` -> `docker_episode.py`, `docker_pool.py`
-> this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agentrl.envs.sandbox.base import SandboxError

log = logging.getLogger(__name__)

LABEL = "agentrl.sandbox"


def proc_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot), or None when no such process exists. Without
    /proc (not Linux) the start time is unknown: "" for a live process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, someone else's
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_alive(labels: dict[str, str], hostname: str | None = None) -> bool:
    """Whether the server that labelled a container (or socket folder) may still be running: its pid is alive
    and started when the label says. Made on another host, or with unreadable labels: counted alive, since we
    cannot tell, so we never touch it."""
    if labels.get("agentrl.host") != (hostname or socket.gethostname()):
        return True
    try:
        pid = int(labels["agentrl.pid"])
    except (KeyError, ValueError):
        return True
    start = proc_start(pid)
    if start is None:
        return False
    return labels.get("agentrl.pid_start") in (None, "", start) or start == ""


def owner_labels(instance_id: str, bundle: str) -> dict[str, str]:
    """The labels that tie a new container to this process and sandbox instance (read by `owner_alive`)."""
    pid = os.getpid()
    return {LABEL: "1", "agentrl.instance": instance_id, "agentrl.pid": str(pid),
            "agentrl.pid_start": proc_start(pid) or "", "agentrl.host": socket.gethostname(),
            "agentrl.bundle": bundle}


# -- the Docker daemon's address, and errors that mean it does not answer -----------------------------------------


def daemon_address() -> str:
    """Where the Docker SDK looks for the daemon (DOCKER_HOST, else the default unix socket)."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


class DockerDaemonError(SandboxError):
    """The Docker daemon does not answer (stopped, or the socket points nowhere)."""


def daemon_down(exc: BaseException) -> bool:
    """Whether `exc` says the daemon did not answer at all (not that it refused a request)."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    import docker

    # docker.from_env() wraps the first failed request: "Error while fetching server API version: (...)". An
    # APIError is the daemon's own answer, whatever its text says.
    wrapped = isinstance(exc, docker.errors.DockerException) and not isinstance(exc, docker.errors.APIError)
    return wrapped and ("Connection aborted" in str(exc) or _timed_out(exc))


def _timed_out(exc: BaseException) -> bool:
    """Whether `exc` is a request the daemon accepted but never answered (a stopped or wedged dockerd)."""
    import requests

    return isinstance(exc, requests.exceptions.Timeout) or "timed out" in str(exc)


R = TypeVar("R")


def guarded(fn: Callable[..., R], *args: Any) -> R:
    """Call the blocking Docker function `fn`; a daemon that does not answer becomes DockerDaemonError."""
    try:
        return fn(*args)
    except Exception as exc:
        if not daemon_down(exc):
            raise
        why = ""
        if _timed_out(exc):  # it listens but does not reply
            why = ("no reply within sandbox.docker_timeout: is dockerd stopped (SIGSTOP), wedged or overloaded? "
                   "DOCKER_HOST picks the daemon; ")
        raise DockerDaemonError(f"the Docker daemon does not answer at {daemon_address()} ({why}{exc})") from None


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


@dataclass(eq=False)
class Box:
    """A started container and its open channel."""

    name: str
    channel: Channel
    started: float = field(default_factory=time.monotonic)


class ContainerHost(Protocol):
    """What an episode handle and the warm pool need from the sandbox that owns their containers."""

    @property
    def closing(self) -> bool:
        """True once the sandbox is shutting down."""

    async def launch(self, warm: bool = False) -> Box:
        """Start a container and wait until its bundle is loaded."""

    async def remove(self, box: Box | str) -> None:
        """Close the container's channel and remove it."""

    def remove_later(self, box: Box | str) -> None:
        """Remove the container in the background."""

    async def death_reason(self, name: str, fallback: str) -> str:
        """Why the container stopped answering (exit code, OOM, stderr tail)."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` as a background task that shutdown cancels."""


# -- blocking Docker API helpers (run on the sandbox's thread pool) ---------------------------------------------


def connect_api(image: str, timeout: float, threads: int) -> tuple[Any, Any]:
    """(API client, health-check client) of the daemon at DOCKER_HOST, once it answers and holds `image`."""
    import docker

    # Every call gets the short `timeout`: a daemon that accepts requests but never answers (SIGSTOP) must fail a
    # reset in seconds, not hold it for the SDK's default minutes.
    api = docker.from_env(timeout=timeout, max_pool_size=threads).api
    api.ping()
    try:
        api.inspect_image(image)
    except docker.errors.ImageNotFound:
        raise SandboxError(f"sandbox image {image!r} not found; build it with "
                           "`python -m agentrl.envs.sandbox.image build`") from None
    # Health checks get their own shorter-timeout client: a wedged daemon must not hold /health for long.
    return api, docker.from_env(timeout=min(5.0, timeout), version=api.api_version).api


def container_state(api: Any, name: str) -> dict[str, Any]:
    """The container's `State` from inspect, or {"Status": "removed"} when it is gone."""
    try:
        return api.inspect_container(name)["State"]
    except Exception as exc:
        if daemon_down(exc):  # no answer says nothing about the container; the caller must not wait on
            raise
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


def remove_orphans(api: Any) -> int:
    """Remove sandbox containers whose owning server is gone (by pid, its start time and host); returns how
    many. A server restarted on the same port is a new owner, so its predecessor's containers go too."""
    removed = 0
    for c in api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        if owner_alive(c.get("Labels") or {}):
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


# -- socket folders ------------------------------------------------------------------------------------------------

SOCKET_DIR_PREFIX = "agentrl-sbx-"
_OWNER_FILE = "owner.json"


def make_socket_dir(path: Path, labels: dict[str, str]) -> None:
    """Create the sandbox's private socket folder, recording its owner so a later sweep can tell it is stale."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True)
    (path / _OWNER_FILE).write_text(json.dumps(labels))


def remove_stale_socket_dirs(root: Path | None = None) -> int:
    """Remove socket folders whose owning server is gone (a hard-killed server leaves its folder)."""
    removed = 0
    for folder in Path(root or tempfile.gettempdir()).glob(f"{SOCKET_DIR_PREFIX}*"):
        try:
            labels = json.loads((folder / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours to judge (no owner recorded, or someone else's)
        if isinstance(labels, dict) and not owner_alive(labels):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed
