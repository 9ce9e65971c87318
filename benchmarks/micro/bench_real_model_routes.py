"""A GRPO step of `calc_smollm2` (SmolLM2-135M, a real model) under three routes, as ratios to the built-in full
fine-tuning path (issue 53, items 4 and 5).

    .venv/bin/python benchmarks/micro/bench_real_model_routes.py [--steps 3] [--warm-start PATH] [--routes grpo,trl,lora]

Routes, each one `python -m agentrl` run through the CLI, one after another, each from the same SFT folder:
  grpo  `+recipe=calc_smollm2` as it is (`trainer=grpo`, full fine-tuning): the baseline;
  trl   `+recipe=calc_smollm2 trainer=trl`: TRL's GRPOTrainer on the recipe's settings, `model_failures=penalize`
        included (a cut play trains at reward 0 in its group; before ca2ba5f TRL had no such key and the route
        passed the recipe's keys without it, so every group holding a cut play was masked out);
  lora  `+recipe=calc_smollm2 model.lora.enabled=true trainer.lr=<--lora-lr>` (model=smollm2's LoRA defaults).
Without `--warm-start`, the SFT folder is made once first: the recipe's own warm start (4 steps), in a run of
`trainer.steps=1` of its own, not timed. Every timed run has `trainer.eval_limit=<--eval-limit>` (1 by default:
the before and after evals play one task each; their seconds are not in a step's), `trainer.checkpoint_every=0`,
and its own AGENTRL_HOME under `--root`, so nothing lands in outputs/ (the converted model is read from the
checkout's outputs/models). Each run holds an exclusive `flock` on `--lock` while it runs, with an OOM score
of 1000 (the kernel kills it first if memory runs out: a shared box's other jobs go on).

Per route it reads `time/step_s` (and the play's and update's seconds, rows drawn, groups kept and tokens trained)
per step from the run's own MLflow store
and samples, every 0.5 s, the summed RSS of the run's process tree (/proc: the CLI process and every descendant,
TRL's included). It prints each step's seconds, then a table: the median s/step over steps 2.. (step 1 is a
warm-up: the first update allocates the optimizer state, the built-in trainer plays step 1 without overlap),
the median over all steps, peak RSS, and each route's s/step as a ratio to grpo's; for trl also grpo/trl, the
issue's goal being <= 0.5.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = "calc_smollm2"
PAGE = os.sysconf("SC_PAGE_SIZE")
KEYS = ("time/step_s", "time/generate_s", "time/train_s", "time/generate_wait_s", "time/weight_push_s",
        "rollout/rows_drawn", "rollout/groups_kept", "train/tokens")


def tree_rss(root: int) -> tuple[int, int]:
    """(summed RSS bytes, process count) of `root` and all its descendants, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total, len(tree)


def oom_first() -> None:
    """In the child before exec: the kernel's OOM killer takes this run (and what it starts) before a neighbour's."""
    try:
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass


def run_cli(home: Path, overrides: list[str], log: Path, lock: Path) -> dict[str, float]:
    """One `python -m agentrl OVERRIDES` run in `home` under the lock; its peak tree RSS and wall seconds."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AGENTRL_HOME": str(home), "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [str(REPO / ".venv/bin/python"), "-m", "agentrl", *overrides]
    with open(lock, "a") as held:
        waited = time.monotonic()
        fcntl.flock(held, fcntl.LOCK_EX)
        waited = time.monotonic() - waited
        print(f"  lock held after {waited:.0f} s; {' '.join(cmd[1:])}", flush=True)
        peak = {"rss": 0, "procs": 0}
        began = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=oom_first)
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    rss, procs = tree_rss(proc.pid)
                    if rss > peak["rss"]:
                        peak["rss"] = rss
                    peak["procs"] = max(peak["procs"], procs)
                    done.wait(0.5)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            code = proc.wait()
            done.set()
            sampler.join()
        wall = time.monotonic() - began
    if code != 0:
        sys.exit(f"run failed ({code}): {' '.join(overrides)}\n{log.read_text()[-4000:]}")
    return {"peak_rss": peak["rss"], "procs": peak["procs"], "wall_s": wall}


def step_metrics(home: Path) -> dict[str, list[float]]:
    """Each of KEYS per step (ordered by step) of the one run under `home`, from its MLflow store."""
    with closing(sqlite3.connect(next(home.rglob("mlflow.db")))) as con:
        return {key: [v for _, v in sorted(con.execute("SELECT step, value FROM metrics WHERE key = ?", (key,)))]
                for key in KEYS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warm-start", help="the SFT folder every route starts from (default: made once here)")
    ap.add_argument("--routes", default="grpo,trl,lora", help="comma-separated, grpo first (the baseline)")
    ap.add_argument("--lora-lr", type=float, default=1e-4, help="trainer.lr under LoRA (the recipe's full: 1e-5)")
    ap.add_argument("--eval-limit", type=int, default=1, help="trainer.eval_limit of every timed run")
    ap.add_argument("--root", default=f"/tmp/agentrl-bench-routes-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--lock", default="/tmp/agentrl-heavy.lock")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every timed run")
    args = ap.parse_args()
    root, lock = Path(args.root), Path(args.lock)
    root.mkdir(parents=True, exist_ok=True)
    models = f"paths.model_dir={REPO / 'outputs' / 'models'}"  # the converted SmolLM2 folder, made once
    print(f"root {root}", flush=True)

    warm = args.warm_start
    if not warm:
        print("warm start: the recipe's SFT, in a run of 1 GRPO step (not timed)", flush=True)
        home = root / "warm-start"
        run_cli(home, [f"+recipe={RECIPE}", "trainer.steps=1", "trainer.eval_limit=1", "trainer.checkpoint_every=0",
                       models], root / "warm-start.log", lock)
        warm = str(next((home / "outputs" / "checkpoints" / "sft").glob("*/model.safetensors")).parent)
    print(f"warm start folder {warm}", flush=True)

    common = [f"trainer.steps={args.steps}", "trainer.eval_every=0", f"trainer.eval_limit={args.eval_limit}",
              "trainer.checkpoint_every=0", f"trainer.warm_start.checkpoint={warm}", models, *args.overrides]
    routes = {
        "grpo": [f"+recipe={RECIPE}", *common],
        "trl": [f"+recipe={RECIPE}", "trainer=trl", f"task_name={RECIPE}_trl", *common],
        "lora": [f"+recipe={RECIPE}", "model.lora.enabled=true", f"trainer.lr={args.lora_lr}", *common],
    }
    results: dict[str, dict] = {}
    for name in args.routes.split(","):
        print(f"route {name}", flush=True)
        home = root / name
        mem = run_cli(home, routes[name], root / f"{name}.log", lock)
        per_step = step_metrics(home)
        results[name] = {**mem, **per_step}
        steps = per_step["time/step_s"]
        print(f"  {name}: wall {mem['wall_s']:.0f} s, peak RSS {mem['peak_rss'] / 2**30:.2f} GB "
              f"({mem['procs']} processes at most); per step: "
              + ", ".join(f"{k.removeprefix('time/')} [" + ", ".join(f"{v:.1f}" for v in vals) + "]"
                          for k, vals in per_step.items() if vals), flush=True)
        if len(steps) != args.steps:
            print(f"  note: {len(steps)} time/step_s values logged for {args.steps} steps", flush=True)
    (root / "results.json").write_text(json.dumps(results, indent=1))

    def med(name: str, key: str, skip: int) -> float:
        vals = results[name][key][skip:] or results[name][key]
        return statistics.median(vals) if vals else float("nan")

    base = med("grpo", "time/step_s", 1) if "grpo" in results else float("nan")
    print(f"\nGRPO step of {RECIPE}, {args.steps} steps per route; median over steps 2-{args.steps} "
          f"(all steps in brackets); peak RSS of the run's process tree:")
    print("| route | s/step | generate s | train s | peak RSS GB | s/step / grpo's |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in results:
        s = med(name, "time/step_s", 1)
        print(f"| {name} | {s:.1f} ({med(name, 'time/step_s', 0):.1f}) | {med(name, 'time/generate_s', 1):.1f} | "
              f"{med(name, 'time/train_s', 1):.1f} | {results[name]['peak_rss'] / 2**30:.2f} | {s / base:.2f}x |")
    if "trl" in results and "grpo" in results:
        ratio = base / med("trl", "time/step_s", 1)
        print(f"\ngrpo/trl = {ratio:.2f} (goal <= 0.5: {'met' if ratio <= 0.5 else 'NOT met'})")
    if "lora" in results and "grpo" in results:
        print(f"lora/grpo: s/step {med('lora', 'time/step_s', 1) / base:.2f}x, peak RSS "
              f"{results['lora']['peak_rss'] / results['grpo']['peak_rss']:.2f}x")


if __name__ == "__main__":
    main()
