"""The Docker sandbox: every episode runs in its own container, started from the local sandbox image.

The container sees only the `agentrl` package (and any bundle folder outside it) bind-mounted read-only under
`/mnt/host`, plus a read-only folder holding the sandbox's unix socket. `container_agent.py` runs inside: it loads
the bundle, connects to the socket, says hello, and answers one JSON line per request. Readiness is the hello
itself (no polling), and a tool call is one round trip on an already-open socket.

Each sandbox object is its own instance, `<name>-<pid>-<random>`, so a server restarted on the same port never
shares an identity (or a container name) with the one it replaces. Containers carry labels so a later instance
removes what a hard-killed one left behind, and only that: `agentrl.sandbox=1`, `agentrl.instance`, `agentrl.pid`,
`agentrl.pid_start` (to spot a reused pid) and `agentrl.host`; a container whose owner process is gone is an
orphan. Blocking Docker SDK calls run on the sandbox's own thread pool, never on the event loop; a daemon that
does not answer (or not within `docker_timeout`: one frozen with SIGSTOP) turns into `DockerDaemonError` naming
its socket, and `health()` reports it.

This module holds the container lifecycle: mounts, start and hello, deploy, teardown, leftover cleanup. The
episode handle is in `docker_episode.py`, the warm pool in `docker_pool.py`, and the labels, the channel and the
blocking Docker calls in `docker_support.py`.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from agentrl.config.sandbox import DockerSandboxConfig
from agentrl.envs.sandbox.base import EpisodeHandle, Sandbox, SandboxError
from agentrl.envs.sandbox.container_agent import DEFAULT_LOADER
from agentrl.envs.sandbox.docker_episode import DockerEpisodeHandle
from agentrl.envs.sandbox.docker_pool import WarmPool
from agentrl.envs.sandbox.docker_support import (
    SOCKET_DIR_PREFIX,
    Box,
    Channel,
    DockerDaemonError,
    Lost,
    RemoteError,
    connect_api,
    container_state,
    daemon_address,
    death_reason,
    guarded,
    make_socket_dir,
    owner_labels,
    remove_container,
    remove_instance,
    remove_orphans,
    remove_stale_socket_dirs,
)
from agentrl.envs.sandbox.image import DEFAULT_IMAGE

log = logging.getLogger(__name__)

HOST_ROOT = "/mnt/host"  # host paths appear under this prefix in the container
SOCKET_DIR = "/run/agentrl"
_LINE_LIMIT = 64 << 20  # longest JSON line (a tool result) the host reads
_PACKAGE = Path(__file__).resolve().parents[2]  # .../agentrl


class DockerSandbox(Sandbox):
    """Deploys each episode of one bundle in its own container (see the module docstring)."""

    def __init__(self, bundle_spec: dict[str, Any], *, image: str = DEFAULT_IMAGE, warm_pool: int = 0,
                 memory: str = "512m", cpus: float = 1.0, network: str = "none", name: str = "sandbox",
                 loader: str = DEFAULT_LOADER, deploy_timeout: float = 60.0, call_timeout: float = 600.0,
                 docker_threads: int = 32, docker_timeout: float | None = None) -> None:
        """`bundle_spec` is `Bundle.spec()` (kwargs of `load_bundle`). `name` (e.g. `gridsim-8200`) starts the
        instance id and container names. `loader` ('module:function' or '/abs/file.py:function') builds the
        bundle in the container; `call_timeout` bounds one episode call; `docker_timeout` (default: the
        `sandbox=docker` config's) bounds one Docker API call."""
        if not isinstance(bundle_spec, dict) or not isinstance(bundle_spec.get("bundle"), str):
            raise ValueError(f"bundle_spec must be a dict with a 'bundle' string (Bundle.spec()), got {bundle_spec!r}")
        try:
            json.dumps(bundle_spec)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bundle_spec must be JSON-safe: {exc}") from exc
        if docker_timeout is None:
            docker_timeout = DockerSandboxConfig.docker_timeout
        if (warm_pool < 0 or cpus <= 0 or deploy_timeout <= 0 or call_timeout <= 0 or docker_threads < 1
                or not docker_timeout > 0):
            raise ValueError("warm_pool must be >= 0; cpus, deploy_timeout, call_timeout, docker_timeout and "
                             "docker_threads > 0")
        self.docker_timeout = float(docker_timeout)
        self.image, self.warm_pool, self.memory, self.cpus, self.network = image, warm_pool, memory, cpus, network
        # Unique per process and object: a restarted server must never take over its predecessor's identity.
        stem = re.sub(r"[^a-zA-Z0-9_.-]", "-", name)[:32]  # Docker's name alphabet
        self.instance_id = f"{stem}-{os.getpid()}-{secrets.token_hex(3)}"
        self.deploy_timeout, self.call_timeout, self.docker_threads = deploy_timeout, call_timeout, docker_threads
        self._mounts: dict[str, str] = {}  # host path -> container path
        self.bundle_spec = self._container_spec(bundle_spec)
        self.loader = self._container_loader(loader)
        # Unix socket paths are limited to ~107 bytes, so the folder name stays short whatever the instance id.
        digest = uuid.uuid5(uuid.NAMESPACE_URL, self.instance_id).hex[:12]
        self.socket_dir = Path(tempfile.gettempdir()) / f"{SOCKET_DIR_PREFIX}{digest}"
        self._api: Any = None
        self._executor: Any = None
        self._server: asyncio.AbstractServer | None = None
        self._pending: dict[str, asyncio.Future] = {}
        self._boxes: dict[str, Box] = {}  # every connected container not yet removed
        self._warm = WarmPool(self, warm_pool)
        self._tasks: set[asyncio.Task] = set()
        self._seq = itertools.count()
        self._started = self._closing = self._pool_closed = False
        self._health_api: Any = None
        self._health_lock = asyncio.Lock()
        self._health: tuple[float, dict[str, Any]] | None = None

    @property
    def closing(self) -> bool:
        """True once shutdown has begun."""
        return self._closing

    # -- mounts -------------------------------------------------------------------------------------------

    def _mount(self, host: Path) -> str:
        """Mount `host` (or the mounted folder above it) read-only; returns its path in the container."""
        host = host.resolve()
        for mounted in self._mounts:
            if host == Path(mounted) or Path(mounted) in host.parents:
                return HOST_ROOT + str(host)
        self._mounts[str(host)] = HOST_ROOT + str(host)
        return HOST_ROOT + str(host)

    def _container_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        self._mount(_PACKAGE)
        out = dict(spec)
        for key, value in spec.items():
            # Absolute paths (and a relative bundle folder) must exist in the container: mount and rewrite them.
            if isinstance(value, str) and (value.startswith("/") or (key == "bundle" and "/" in value)):
                path = Path(value).expanduser()
                if path.exists():
                    out[key] = self._mount(path)
        return out

    def _container_loader(self, loader: str) -> str:
        target, _, attr = loader.rpartition(":")
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_absolute() or not path.is_file():
                raise ValueError(f"loader file {target!r} must be an existing absolute path")
            return f"{self._mount(path.parent)}/{path.name}:{attr}"
        return loader

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def _run(self, fn: Any, *args: Any) -> Any:
        """Run a blocking Docker call on the pool; a daemon that does not answer raises DockerDaemonError."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, guarded, fn, *args)

    def _connect(self) -> Any:
        api, self._health_api = connect_api(self.image, self.docker_timeout, self.docker_threads)
        return api

    async def start(self) -> None:
        """Connect to Docker, remove leftovers of dead instances, listen on the socket, fill the warm pool."""
        if self._started:
            return
        from concurrent.futures import ThreadPoolExecutor

        self._executor = ThreadPoolExecutor(self.docker_threads, thread_name_prefix="agentrl-docker")
        try:
            self._api = await self._run(self._connect)
        except Exception as exc:
            self._executor.shutdown(wait=False)
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"no Docker daemon answers at {daemon_address()}: {exc}") from exc
        removed = await self._run(self.remove_leftovers)
        if removed:
            log.info("removed %d containers left by dead sandbox instances", removed)
        make_socket_dir(self.socket_dir, owner_labels(self.instance_id, ""))
        sock = self.socket_dir / "host.sock"
        self._server = await asyncio.start_unix_server(self._on_connect, path=str(sock), limit=_LINE_LIMIT)
        os.chmod(sock, 0o600)  # the containers run as our uid; nobody else may talk to them
        self._mounts[str(self.socket_dir)] = SOCKET_DIR
        self._started = True
        atexit.register(self._atexit)
        if self.warm_pool:
            await self._warm.fill()
            if not self.warm_ready():
                await self.shutdown()
                raise SandboxError(f"none of the {self.warm_pool} warm containers started; see the log")

    def remove_leftovers(self) -> int:
        """Remove containers (and socket folders) whose owning server is gone (blocking); returns how many
        containers were removed."""
        remove_stale_socket_dirs(self.socket_dir.parent)
        return remove_orphans(self._api)

    async def health(self) -> dict[str, Any]:
        """{"status": "healthy"|"unhealthy", ...}: whether the daemon answers a ping (checked at most once a
        second, whatever the polling rate)."""
        async with self._health_lock:
            if self._health is not None and time.monotonic() - self._health[0] < 1.0:
                return self._health[1]
            report: dict[str, Any] = {"kind": "docker", "daemon": daemon_address()}
            if not self._started or self._closing:
                report.update(status="unhealthy", error="the docker sandbox is not running")
            else:
                try:
                    await asyncio.to_thread(guarded, self._health_api.ping)
                    report.update(status="healthy", containers=len(self._boxes), warm_ready=self.warm_ready())
                except Exception as exc:
                    report.update(status="unhealthy", error=str(exc))
            self._health = (time.monotonic(), report)
            return report

    async def shutdown(self) -> None:
        """Remove every container of this instance (live episodes included), then release the thread pool."""
        if not self._started or self._closing:
            return
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await asyncio.gather(*(self.remove(b) for b in list(self._boxes.values())), return_exceptions=True)
        if self._server is not None:
            self._server.close()
        # Let container starts still in flight finish, then the label sweep removes whatever is left.
        self._pool_closed = True
        await asyncio.to_thread(self._executor.shutdown, True)
        try:
            await asyncio.to_thread(guarded, self._sweep)
        except DockerDaemonError as exc:  # nothing to do now; the next server's start removes them
            log.warning("could not remove this sandbox's containers: %s", exc)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        atexit.unregister(self._atexit)
        self._api.close()
        self._health_api.close()

    def _sweep(self) -> None:
        remove_instance(self._api, self.instance_id)

    def _atexit(self) -> None:
        try:  # the server stops without shutdown(): still take our containers with us
            self._sweep()
        except Exception:
            pass

    def warm_ready(self) -> int:
        """How many warm containers wait for a task now."""
        return len(self._warm)

    def live_containers(self) -> list[str]:
        """Names of this instance's containers the sandbox holds (warm or playing)."""
        return sorted(self._boxes)

    # -- deploying ----------------------------------------------------------------------------------------

    async def deploy(self, split: str, index: int) -> EpisodeHandle:
        """Start an episode of task `index` of `split` (on a warm container when one is ready)."""
        if not self._started or self._closing:
            raise SandboxError("the docker sandbox is not running (call start() first)")
        warm = await self._warm.assign(split, index)
        if warm is not None:
            return DockerEpisodeHandle(self, *warm)
        box = await self.launch()
        try:
            task_id = await box.channel.request("episode", split=split, index=index)
        except (Lost, RemoteError) as exc:
            await self.remove(box)
            raise SandboxError(f"deploying {split}[{index}] failed: {exc}") from None
        except BaseException:
            await asyncio.shield(self.remove(box))
            raise
        return DockerEpisodeHandle(self, box, task_id["task_id"])

    def _create(self, name: str, warm: bool) -> str:
        api = self._api
        host_config = api.create_host_config(
            binds={h: {"bind": c, "mode": "ro"} for h, c in self._mounts.items()},
            network_mode=self.network, mem_limit=self.memory, nano_cpus=int(self.cpus * 1e9), pids_limit=256,
            read_only=True, tmpfs={"/tmp": "size=64m"}, cap_drop=["ALL"], security_opt=["no-new-privileges"])
        labels = owner_labels(self.instance_id, str(self.bundle_spec["bundle"]).rsplit("/", 1)[-1])
        env = {"AGENTRL_TOKEN": name, "AGENTRL_SOCKET": f"{SOCKET_DIR}/host.sock", "HOME": "/tmp",
               "AGENTRL_BUNDLE_SPEC": json.dumps(self.bundle_spec), "AGENTRL_BUNDLE_LOADER": self.loader,
               "PYTHONPATH": HOST_ROOT + str(_PACKAGE.parent), "PYTHONDONTWRITEBYTECODE": "1",
               "AGENTRL_PRELOAD": "1" if warm else "0"}
        # -P keeps the agent's own folder (which holds docker.py, image.py) off sys.path.
        agent = f"{HOST_ROOT}{_PACKAGE}/envs/sandbox/container_agent.py"
        cid = api.create_container(self.image, ["python3", "-P", agent], name=name, labels=labels,
                                   environment=env, host_config=host_config, working_dir="/tmp",
                                   user=f"{os.getuid()}:{os.getgid()}", use_config_proxy=False)["Id"]
        api.start(cid)
        return cid

    async def launch(self, warm: bool = False) -> Box:
        """Start a container and wait for its hello (the bundle is loaded then)."""
        loop = asyncio.get_running_loop()
        name = f"agentrl-{self.instance_id}-{next(self._seq)}"
        hello: asyncio.Future = loop.create_future()
        self._pending[name] = hello
        created = loop.run_in_executor(self._executor, guarded, self._create, name, warm)
        try:
            await asyncio.shield(created)
            deadline = time.monotonic() + self.deploy_timeout
            check = 1.0  # look at the container now and then (backing off: inspects load a busy daemon)
            while not hello.done():
                await asyncio.wait({hello}, timeout=check)
                check = min(check * 2, 8.0)
                if hello.done():
                    break
                state = await self._run(self._state, name)
                if state.get("Status") not in ("created", "running"):
                    reason = await self.death_reason(name, "it exited before it was ready")
                    raise SandboxError(f"the sandbox container {name} did not start: {reason}")
                if time.monotonic() > deadline:
                    raise SandboxError(f"the sandbox container {name} was not ready within {self.deploy_timeout:g}s")
            reader, writer, msg = hello.result()
            if not msg.get("ok"):
                writer.close()
                raise SandboxError(f"the bundle failed to load in the container: {msg.get('error')}")
        except BaseException as exc:
            self._pending.pop(name, None)
            if created.done() and not isinstance(exc, asyncio.CancelledError | DockerDaemonError):
                try:
                    await self.remove(name)
                except Exception as rm_exc:
                    log.warning("removing failed container %s: %s", name, rm_exc)
            else:  # still in creation (a cancelled deploy), or a daemon that does not answer (the reset fails
                # now, not after another docker_timeout): remove it in the background once it can be
                created.add_done_callback(lambda _f: self.remove_later(name))
            if isinstance(exc, Exception) and not isinstance(exc, SandboxError):
                raise SandboxError(f"starting a sandbox container failed: {exc}") from exc
            raise
        box = Box(name, Channel(reader, writer, self.call_timeout))
        self._boxes[name] = box
        return box

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), self.deploy_timeout)
            msg = json.loads(line)
            fut = self._pending.pop(msg["hello"], None)
        except Exception:
            fut = None
        if fut is None or fut.done():
            writer.close()  # a container we no longer wait for; it exits on EOF
            return
        fut.set_result((reader, writer, msg))

    # -- teardown -----------------------------------------------------------------------------------------

    def _state(self, name: str) -> dict[str, Any]:
        return container_state(self._api, name)

    async def death_reason(self, name: str, fallback: str) -> str:
        """Why a container stopped answering: its exit code, OOM flag and last stderr lines."""
        return await self._run(death_reason, self._api, name, fallback, self.memory)

    async def remove(self, box: Box | str) -> None:
        """Close a container's channel and remove the container."""
        name = box if isinstance(box, str) else box.name
        box = self._boxes.pop(name, None) or box
        if isinstance(box, Box):
            box.channel.close()
        if self._pool_closed:
            return  # shutdown's label sweep removed it
        await self._run(self._remove_container, name)

    def _remove_container(self, name: str) -> None:
        remove_container(self._api, name)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` as a background task; shutdown cancels it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def remove_later(self, box: Box | str) -> None:
        """Remove a container in the background (shutdown's label sweep catches it if the pool is gone)."""
        if self._executor is None or self._closing:
            return  # shutdown's label sweep removes it
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self.spawn(self._remove_quietly(box))

    async def _remove_quietly(self, box: Box | str) -> None:
        try:
            await self.remove(box)
        except Exception as exc:  # e.g. the daemon does not answer: shutdown's label sweep tries again
            log.warning("removing container %s failed: %s", box if isinstance(box, str) else box.name, exc)
