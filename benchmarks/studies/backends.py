"""Head to head: the same recipe under `trainer=grpo` (built in) and `trainer=trl` (TRL's GRPOTrainer).

One Hydra multirun, `trainer=grpo,trl seed=...`, so every job is a child MLflow run under one parent, with the
same warm start folder, seeds, steps and eval split. From the MLflow store it then reports, per backend:
eval/reward at step 0 and at every eval step (mean ± standard error over the seeds), seconds per step split
into generate (the plays' wall time), the part of it the step waited for (less than generate when the built-in
trainer plays the next step while one trains, `trainer.max_staleness=1`), train, and other (step - waited -
train: the weight push, the group filter, logging),
and the peak resident memory of the process tree while that job ran (sampled every 0.5 s with psutil).

    python benchmarks/studies/backends.py --steps 20 --eval-every 10 --eval-limit 200 --seeds 0,1,2 \\
        --warm-start PATH --results benchmarks/RESULTS.md

The box's load average is sampled too and printed with the table: on a shared machine it moves every number.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentrl.paired import mean_se as paired_mean_se

REPO = Path(__file__).resolve().parents[2]


class TreeSampler:
    """RSS of a process and all its descendants, and the load average, every `period` seconds."""

    def __init__(self, pid: int, period: float = 0.5) -> None:
        import psutil

        self.proc, self.period = psutil.Process(pid), period
        self.samples: list[tuple[float, float, float]] = []  # (unix time, RSS MiB, 1-min load average)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import psutil

        while not self.stop.is_set():
            rss = 0
            try:
                for p in [self.proc, *self.proc.children(recursive=True)]:
                    try:
                        rss += p.memory_info().rss
                    except psutil.Error:
                        pass  # a child that just ended
            except psutil.Error:
                break
            self.samples.append((time.time(), rss / 2**20, os.getloadavg()[0]))
            self.stop.wait(self.period)

    def peak(self, start: float, end: float) -> float:
        return max((m for t, m, _ in self.samples if start <= t <= end), default=float("nan"))

    def load(self) -> float:
        return statistics.fmean(x for *_, x in self.samples) if self.samples else float("nan")


def mean_se(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return float("nan"), float("nan")
    return paired_mean_se(values)


def collect(uri: str, since_ms: int, sampler: TreeSampler | None, parent_id: str | None = None
            ) -> list[dict[str, Any]]:
    """One record per child run of the newest sweep parent started after `since_ms` (or of `parent_id`)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    parents = [r for r in client.search_runs(exps, "tags.`agentrl.sweep` = 'true'") if r.info.start_time >= since_ms
               and parent_id in (None, r.info.run_id)]
    if not parents:
        raise SystemExit("no sweep parent run found: did the multirun start?")
    parent = max(parents, key=lambda r: r.info.start_time)
    children = client.search_runs(exps, f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    out = []
    for run in children:
        rid = run.info.run_id

        def series(key: str, rid: str = rid) -> dict[int, float]:
            return {m.step: m.value for m in client.get_metric_history(rid, key)}

        steps = {k: series(f"time/{k}_s") for k in ("generate", "generate_wait", "train", "step")}
        if not steps["generate_wait"]:  # played, then trained (TRL; the built-in trainer before it logged waits)
            steps["generate_wait"] = steps["generate"]
        steps.update({k: series(f"rollout/{k}") for k in ("rows_drawn", "groups_kept")})
        train_steps = sorted(s for s in steps["step"] if s > 0)
        per_step = {k: statistics.fmean(steps[k][s] for s in train_steps if s in steps[k]) if train_steps else
                    float("nan") for k in steps}
        end = (run.info.end_time or int(time.time() * 1000)) / 1000
        out.append({"run_id": rid, "parent": parent.info.run_id, "backend": run.data.tags.get("choice.trainer"),
                    "seed": run.data.params.get("seed"), "status": run.info.status, "eval": series("eval/reward"),
                    "greedy": run.data.metrics.get("eval_greedy/reward", float("nan")),
                    "generate_s": per_step["generate"], "wait_s": per_step["generate_wait"], "train_s": per_step["train"], "step_s": per_step["step"],
                    "rows_drawn": per_step["rows_drawn"], "groups_kept": per_step["groups_kept"],
                    "peak_mib": sampler.peak(run.info.start_time / 1000, end) if sampler else float("nan")})
    return out


def table(records: list[dict[str, Any]]) -> str:
    """The markdown tables: eval reward by step, then time per step and memory, one row per backend."""
    by = defaultdict(list)
    for r in records:
        by[r["backend"]].append(r)
    steps = sorted({s for r in records for s in r["eval"]})
    head = "| backend | seeds | " + " | ".join(f"eval/reward @ {s}" for s in steps) + " | eval_greedy (end) |"
    lines = [head, "|" + " --- |" * (3 + len(steps))]
    for backend, rs in sorted(by.items()):
        cells = []
        for s in steps:
            m, se = mean_se([r["eval"].get(s, float("nan")) for r in rs])
            cells.append(f"{m:.3f} ± {se:.3f}")
        g, gse = mean_se([r["greedy"] for r in rs])
        lines.append(f"| {backend} | {len(rs)} | " + " | ".join(cells) + f" | {g:.3f} ± {gse:.3f} |")
    lines += ["", "| backend | s/step | generate (play) | of it waited for | train | other | rows played / groups "
                  "trained per step | peak RSS, fresh process (MiB) | peak RSS in the multirun (MiB) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for backend, rs in sorted(by.items()):
        step, gen, wait, train = (mean_se([r[k] for r in rs])[0] for k in ("step_s", "generate_s", "wait_s", "train_s"))
        peak = max(r["peak_mib"] for r in rs)
        fresh = rs[0].get("fresh_peak_mib", float("nan"))
        rows, kept = (mean_se([r[k] for r in rs])[0] for k in ("rows_drawn", "groups_kept"))
        lines.append(f"| {backend} | {step:.2f} | {gen:.2f} | {wait:.2f} | {train:.2f} | {step - wait - train:.2f} | "
                     f"{rows:.1f} / {kept:.1f} | {fresh:.0f} | {peak:.0f} |")
    if {"grpo", "trl"} <= by.keys():
        g, t = (mean_se([r["step_s"] for r in by[b]])[0] for b in ("grpo", "trl"))
        last = steps[-1] if steps else None
        eg, et = (mean_se([r["eval"].get(last, float("nan")) for r in by[b]])[0] for b in ("grpo", "trl"))
        lines += ["", f"grpo/trl time per step: {g / t:.2f} (goal <= 0.5); final eval/reward grpo {eg:.3f} vs "
                      f"trl {et:.3f} (goal: grpo >= trl)"]
    return "\n".join(lines)


def busy_note(load: float) -> str:
    """What the mean load average says about the timings: only above one job per core did others compete."""
    cores = os.cpu_count() or 1
    return ("quiet: the multirun had the cores to itself" if load <= cores else
            "shared box: other jobs ran beside it, every second above is inflated")


def run_sampled(command: list[str], env: dict[str, str], log_path: Path) -> TreeSampler:
    """Run `command`, sampling its process tree; raises SystemExit when it fails."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        sampler = TreeSampler(proc.pid)
        sampler.thread.start()
        code = proc.wait()
        sampler.stop.set()
        sampler.thread.join()
    if code != 0:
        raise SystemExit(f"{shlex.join(command[1:])} failed ({code}); its output: {log_path}")
    return sampler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="gridsim_grpo")
    ap.add_argument("--backends", default="grpo,trl")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-limit", type=int, default=200)
    ap.add_argument("--warm-start", help="one SFT folder for every job (default: the recipe's own, per seed)")
    ap.add_argument("--home", default=str(REPO / "outputs" / "backends"), help="AGENTRL_HOME of the jobs")
    ap.add_argument("--results", help="append the report to this markdown file")
    ap.add_argument("--memory-steps", type=int, default=2, help="steps of the fresh-process memory runs (0: none)")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides, applied to every job")
    ap.add_argument("--parent", help="only report the sweep with this MLflow parent run id (no memory columns)")
    args = ap.parse_args(argv)
    home = Path(args.home)
    home.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{home / 'mlflow.db'}"
    if args.parent:
        print(table(collect(uri, 0, None, args.parent)))
        return

    def build(backends: str, seeds: str, steps: int, task: str) -> list[str]:
        cmd = [sys.executable, "-m", "agentrl", *(["-m"] if task == "backends" else []), f"+recipe={args.recipe}",
               f"seed={seeds}", f"trainer={backends}", f"trainer.steps={steps}",  # seed first: jobs alternate
               f"trainer.eval_every={args.eval_every}", f"trainer.eval_limit={args.eval_limit}",
               "trainer.checkpoint_every=0", f"task_name={task}"]
        if args.warm_start:
            cmd.append(f"trainer.warm_start.checkpoint={args.warm_start}")
        return cmd + args.overrides

    command = build(args.backends, args.seeds, args.steps, "backends")
    env = {**os.environ, "AGENTRL_HOME": str(home), "MLFLOW_TRACKING_URI": uri, "TOKENIZERS_PARALLELISM": "false",
           "TRL_EXPERIMENTAL_SILENCE": "1"}
    print("$ " + shlex.join(command), flush=True)
    since = int(time.time() * 1000)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    sampler = run_sampled(command, env, home / f"backends-{since}.log")
    records = collect(uri, since, sampler)
    # The multirun's jobs share one process, which keeps an earlier job's heap: peak memory comes from one
    # fresh process per backend instead (seed 0, same overrides, `--memory-steps` steps).
    fresh: dict[str, float] = {}
    if args.memory_steps > 0:
        for backend in args.backends.split(","):
            single = build(backend, "0", args.memory_steps, "backends_memory")
            print("$ " + shlex.join(single), flush=True)
            fresh[backend] = max(m for _, m, _ in run_sampled(single, env, home / f"memory-{backend}.log").samples)
    for r in records:
        r["fresh_peak_mib"] = fresh.get(r["backend"], float("nan"))
    report = "\n".join([
        f"`{shlex.join(command[1:])}` (`benchmarks/studies/backends.py`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:"
        f" {len(records)} child runs under MLflow parent {records[0]['parent'] if records else '?'}, "
        f"{(time.monotonic() - started) / 60:.1f} min wall.",
        f"Load: {os.cpu_count()} CPUs, 1-min load average {load_before:.1f} at the start, {sampler.load():.1f} "
        f"mean while it ran ({busy_note(sampler.load())}).", "", table(records)])
    print(report, flush=True)
    if args.results:
        with open(args.results, "a") as f:
            f.write("\n" + report + "\n")


if __name__ == "__main__":
    main()
