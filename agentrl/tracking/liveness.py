"""Whether a RUNNING MLflow run still has a process behind it: a heartbeat while it lives, a check at each start.

A run killed with `kill -9` (or by the OOM killer, or a lost machine) never reaches `set_terminated`, so MLflow
would show it RUNNING forever. Each run records its host, pid and process start, and refreshes a heartbeat tag;
the next run started in the experiment closes every RUNNING run whose process is gone (same host) or whose
heartbeat is stale (another host), as KILLED, with a tag saying why.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentrl.tracking.tracker import continue_line

HOST_TAG = "agentrl.host"
PID_TAG = "agentrl.pid"
# The pid namespace: containers sharing a hostname (host networking) number their processes apart.
PID_NS_TAG = "agentrl.pid_ns"
# The boot id and start time of the process: a pid reused by a later process (or after a reboot) reads differently.
PROCESS_START_TAG = "agentrl.process_start"
HEARTBEAT_TAG = "agentrl.heartbeat"  # Unix seconds of the last beat
FOUND_DEAD_TAG = "agentrl.found_dead"  # why a later start closed this run
# Far more RUNNING runs than this in one experiment is no case to optimize for; the newest are checked first.
_MAX_RUNNING = 1000

log = logging.getLogger(__name__)


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 onwards), None where there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after its last ')' are plain.
    return stat[stat.rindex(")") + 2:].split()


def process_start(pid: int) -> str | None:
    """`<boot id>:<start time in clock ticks>` of a live process (Linux), None where unknown."""
    fields = _proc_stat(pid)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{fields[19]}" if fields and len(fields) > 19 else None  # field 22: starttime


def process_alive(pid: int, start: str | None) -> bool:
    """Whether process `pid` still runs and, when its recorded start is known, is the same process."""
    fields = _proc_stat(pid)
    if fields is not None:
        if fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent
            return False
        current = process_start(pid)
        return start is None or current is None or current == start
    if Path("/proc/self/stat").exists():  # a /proc without this pid: it is gone
        return False
    try:  # no /proc (macOS): the pid exists or not, reuse undetectable
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_namespace() -> str | None:
    """This process's pid namespace (`pid:[4026531836]`, Linux), None where unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_tags(now: float | None = None) -> dict[str, str]:
    """The tags that name this process and its first heartbeat."""
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()),
            HEARTBEAT_TAG: str(int(now if now is not None else time.time()))}
    for key, value in ((PROCESS_START_TAG, process_start(os.getpid())), (PID_NS_TAG, pid_namespace())):
        if value:
            tags[key] = value
    return tags


def _ago(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def why_dead(tags: dict[str, str], *, now: float, stale_after_s: float, host: str,
             pid_ns: str | None = None) -> str | None:
    """Why a RUNNING run's process is gone; None while it may live (or when the run records no process).

    On this host (and pid namespace) the process itself decides: a live process is no death even if its
    heartbeat is late (a stopped or very busy process). From elsewhere only the heartbeat's age can tell.
    """
    try:
        beat = float(tags[HEARTBEAT_TAG])
    except (KeyError, ValueError):
        return None  # a run made before heartbeats (or by another tool): nothing to judge it by
    pid = tags.get(PID_TAG, "?")
    where = f"process {pid} on host {tags.get(HOST_TAG, '?')}"
    same_ns = PID_NS_TAG not in tags or pid_ns is None or tags[PID_NS_TAG] == pid_ns
    if tags.get(HOST_TAG) == host and same_ns and pid.isdigit():
        if process_alive(int(pid), tags.get(PROCESS_START_TAG)):
            return None
        return f"its {where} is gone (last heartbeat {_ago(max(now - beat, 0))} before this check)"
    if now - beat > stale_after_s:
        return f"no heartbeat from its {where} for {_ago(now - beat)} (logger.stale_after_s={stale_after_s:g})"
    return None


@dataclass(frozen=True)
class DeadRun:
    """A RUNNING run that a start found without a live process, and closed."""

    run_id: str
    name: str
    task: str  # its task_name
    reason: str
    overrides: str  # its Hydra overrides, as the command line had them
    run_dir: str


def mark_dead_runs(client: Any, experiment_id: str, *, stale_after_s: float, found_by: str | None = None,
                   skip: frozenset[str] = frozenset()) -> list[DeadRun]:
    """Close as KILLED every RUNNING run of the experiment whose process is gone; return them.

    The run ends at its last heartbeat (its true end, to within one beat), tagged with the reason.
    """
    now, host, pid_ns = time.time(), socket.gethostname(), pid_namespace()
    running = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'",
                                 max_results=_MAX_RUNNING)
    found: list[DeadRun] = []
    for run in running:
        run_id, tags = run.info.run_id, run.data.tags
        if run_id in skip:
            continue
        if (reason := why_dead(tags, now=now, stale_after_s=stale_after_s, host=host, pid_ns=pid_ns)) is None:
            continue
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        by = f" by run {found_by}" if found_by else ""
        client.set_tag(run_id, FOUND_DEAD_TAG, f"{reason}; marked KILLED{by} at {stamp}")
        client.set_terminated(run_id, status="KILLED", end_time=int(float(tags[HEARTBEAT_TAG]) * 1000))
        found.append(DeadRun(run_id=run_id, name=run.info.run_name or "", task=run.data.params.get("task_name", ""),
                             reason=reason, overrides=tags.get("hydra.overrides", ""),
                             run_dir=tags.get("agentrl.run_dir", "")))
        log.warning("MLflow run %s (%s) was left RUNNING: %s; marked KILLED", run_id, run.info.run_name, reason)
    return found


class Heartbeat:
    """Refreshes a run's heartbeat tag every `every_s` seconds from a daemon thread (one small write a beat)."""

    def __init__(self, client: Any, run_id: str, every_s: float) -> None:
        self.client, self.run_id, self.every_s = client, run_id, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="agentrl-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.client.set_tag(self.run_id, HEARTBEAT_TAG, str(int(time.time())))
            except Exception as err:  # noqa: BLE001 - a store hiccup must not end the run; the next beat retries
                log.debug("heartbeat of run %s not written: %s", self.run_id, err)

    def stop(self) -> None:
        """Stop beating (waits for a beat being written, briefly: a hung store must not hold the run's end)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def dead_run_note(dead: DeadRun, *, resumable: bool) -> list[str]:
    """The closing block's lines about an earlier run of this task that a start found dead: what, and how
    to continue it (or rerun it, for a trainer that cannot resume)."""
    name = f" ({dead.name})" if dead.name else ""
    return [f"found dead    earlier run {dead.run_id}{name} of this task: {dead.reason}; marked KILLED",
            continue_line(dead.overrides.split(), dead.run_id, resumable=resumable)]

