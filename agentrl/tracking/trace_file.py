"""Episode traces through a file: a process without the run's tracker (an accelerate rank of `trainer=trl`) writes
its traces as JSON Lines, and the process that holds the tracker reads them back and logs them.

The file holds `trace_record` data only (plain dicts), so writing it needs no MLflow.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

from agentrl.tracking.trace_record import EpisodeTrace, TracedCall, TracedRole, TracedTurn


class TraceFileError(ValueError):
    """A trace file line that is not an episode trace (the file and line are named)."""


class TraceFile:
    """Stands in for `Tracker.log_traces` in a process without the tracker: appends each trace to `path`.

    `trace_train_fraction` is the run's (`logger.trace_train_fraction`), read by the rollout runner's draw."""

    def __init__(self, path: Path, trace_train_fraction: float) -> None:
        self.path, self.trace_train_fraction = Path(path), float(trace_train_fraction)
        self._lock = threading.Lock()  # plays end on several threads; one line per trace, never interleaved

    def log_traces(self, traces: list[EpisodeTrace]) -> None:
        """Append `traces`, one JSON line each."""
        lines = "".join(json.dumps(dataclasses.asdict(t), default=str) + "\n" for t in traces)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as out:
                out.write(lines)


def _trace(data: dict[str, Any]) -> EpisodeTrace:
    roles = [TracedRole(role["role"], [TracedTurn(**{**turn, "calls": [TracedCall(**c) for c in turn["calls"]]})
                                       for turn in role["turns"]], role["outcome"], role.get("failure", ""))
             for role in data["roles"]]
    return EpisodeTrace(data["name"], data["task"], roles, data["tags"], data.get("outcome", {}))


def read_trace_file(path: Path) -> list[EpisodeTrace]:
    """The traces a `TraceFile` wrote at `path` ([] when there is no file); a torn last line (a killed writer) is
    skipped, any other bad line raises `TraceFileError`."""
    if not Path(path).is_file():
        return []
    lines = Path(path).read_text().split("\n")
    traces = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            traces.append(_trace(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):  # no newline after it: the writer died mid-line
                break
            raise TraceFileError(f"{path} line {number}: not an episode trace ({exc})") from None
    return traces
