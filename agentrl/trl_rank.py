"""One rank of a multi-process `trainer=trl` run: the process `accelerate launch` starts (trainers/trl/args.py: WORKER_MODULE).

It rebuilds the run's plan from the spec the parent wrote, with the same `build_plan` (and so the same checks)
as `run.py`, then trains its rank with `trainers.trl.worker.train`. It sits beside `__main__`, above the plan:
a process entry composes; the trainers below it never build a plan.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from agentrl.config.portable import PortableConfigError, from_portable
from agentrl.console import quiet_console
from agentrl.plan import Plan, PlanError, build_plan
from agentrl.play.dependency_breaker import DependencyLost
from agentrl.tracking.trace_file import TraceFile
from agentrl.trainers.trl.worker import LOST_FILE, TRACES_PREFIX, train


def rank_plan(spec: dict) -> Plan:
    """The run's plan from the parent's spec (its typed config and choices), checked as `run.py` checks it.

    Raises SystemExit naming the key for a config the plan refuses (the spec is a file: anyone can edit it)."""
    try:
        cfg = from_portable(spec["config"])
        return build_plan(cfg, choices=spec.get("choices") or {}, run_dir=Path(spec["run_dir"]))
    except (PortableConfigError, PlanError) as err:
        raise SystemExit(f"agentrl: trainer=trl worker: {err}") from None


def main(argv: list[str] | None = None) -> None:
    """Read the spec the parent wrote, train this rank; rank 0 writes metrics and the final result, every rank
    its episode traces (`trl_traces_<pid>.jsonl`, which the parent logs)."""
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    plan = rank_plan(spec)
    metrics_path = Path(spec["metrics_path"])

    def to_file(metrics: dict[str, float], step: int) -> None:
        with metrics_path.open("a") as f:  # one line per call; the parent tails this file into the Tracker
            f.write(json.dumps({"step": step, "metrics": metrics}) + "\n")

    try:
        final = train(plan, start_path=spec["start_path"], output_dir=spec["output_dir"],
                      run_dir=spec["run_dir"], sink=to_file, resume_from=spec.get("resume_from"),
                      record=spec.get("record"),
                      traces=TraceFile(Path(spec["run_dir"], f"{TRACES_PREFIX}{os.getpid()}.jsonl"),
                                       spec["trace_train_fraction"]))
    except DependencyLost as err:  # the parent reads it: one line for the user, not a rank's traceback
        Path(spec["run_dir"], LOST_FILE).write_text(str(err))
        raise
    if final:
        Path(spec["final_path"]).write_text(json.dumps(final))


if __name__ == "__main__":
    quiet_console()
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per chat turn would drown the output
    main()
