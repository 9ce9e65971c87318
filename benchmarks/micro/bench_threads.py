"""`trainer.threads`: the flagship recipe's GRPO step and its SFT step with torch's default threads vs one.

    python benchmarks/micro/bench_threads.py --warm-start PATH     # an SFT folder to start GRPO from (else made: ~5 min)
    python benchmarks/micro/bench_threads.py --rounds 2 --grpo-steps 25 --sft-steps 200
    python benchmarks/micro/bench_threads.py --contended --warm-start PATH   # slowdown beside one busy process

Runs `python -m agentrl` as a user would, alternating the two settings (`trainer.threads=0`, torch's default,
and `trainer.threads=1`) so that both see the same machine load, and reads each run's step times back from its
own MLflow store: the GRPO step's mean (step 1 left out: warm-up) split into generate and train, and the SFT
run's seconds for its steps (from its progress bar). Prints the mean of each setting and the ratio.

`--contended` measures each thread setting alone and beside one competing busy process (a Python loop that
never sleeps, as another job on a shared box) and prints the slowdown (beside / alone) of the SFT warm start and
of the GRPO step for: one thread, and torch's default (one per core) with OpenMP's wait policy unset, ACTIVE
(threads waiting at a barrier spin) and PASSIVE (they sleep).
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def agentrl(home: Path, args: list[str], extra_env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, "-m", "agentrl", *args], cwd=REPO, capture_output=True, text=True,
                          env={**_environ(), "AGENTRL_HOME": str(home), **(extra_env or {})}, timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"agentrl {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def _environ() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("OMP_NUM_THREADS", None)  # the setting under test decides
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    return env


# name -> (trainer.threads, extra environment) of each setting `--contended` compares
CONTENDED_SETTINGS = {
    "1 thread": (1, {}),
    # libgomp's own default (spin a while at each barrier, then sleep): set but empty, so that agentrl's import
    # does not make it PASSIVE (agentrl/__init__.py), and libgomp ignores the empty value
    "default": (0, {"OMP_WAIT_POLICY": ""}),
    "default, active": (0, {"OMP_WAIT_POLICY": "ACTIVE"}),  # spins until the other threads arrive
    "default, passive": (0, {"OMP_WAIT_POLICY": "PASSIVE"}),  # sleeps at once
    # between the two: spin about 10k iterations (microseconds, libgomp's default is 300k), then sleep
    "default, spin 10k": (0, {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "10000"}),
}


def metric_means(home: Path, keys: Iterable[str]) -> dict[str, float]:
    """Each metric's mean over steps 2.. (step 1 is played then trained at every setting) of the one run under
    `home`, read from its own MLflow store; nan where it was not logged."""
    with closing(sqlite3.connect(next(home.rglob("mlflow.db")))) as con:
        out = {}
        for key in keys:
            values = [v for (v,) in con.execute("SELECT value FROM metrics WHERE key = ? AND step > 1", (key,))]
            out[key] = statistics.fmean(values) if values else float("nan")
    return out


def grpo_step_times(home: Path) -> dict[str, float]:
    """Mean seconds of a GRPO step and its parts, steps 2.. (one run, its own MLflow store)."""
    means = metric_means(home, ("time/step_s", "time/generate_s", "time/train_s"))
    return {key.removeprefix("time/").removesuffix("_s"): value for key, value in means.items()}


def sft_seconds(log: str, steps: int) -> float:
    """The SFT progress bar's elapsed time at its last step ("200/200 [01:05<...")."""
    found = re.findall(rf"{steps}/{steps} \[(\d+):(\d+)", log)
    if not found:
        sys.exit("no finished SFT progress bar in the run's output")
    minutes, seconds = found[-1]
    return 60 * int(minutes) + int(seconds)


def contended(root: Path, warm: str, rounds: int, grpo_steps: int, sft_steps: int,
              names: list[str] | None = None) -> None:
    """Each setting alone and beside one busy process: SFT seconds and GRPO step seconds, and the slowdowns."""
    settings = {n: CONTENDED_SETTINGS[n] for n in (names or CONTENDED_SETTINGS)}
    results: dict[tuple[str, bool], dict[str, list[float]]] = {}
    for r in range(rounds):
        for busy in (False, True):
            competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                for name, (threads, extra) in settings.items():
                    tag = f"{r}-{int(busy)}-{threads}-{extra.get('OMP_WAIT_POLICY', '').lower() or 'unset'}"
                    home = root / f"grpo-{tag}"
                    agentrl(home, ["+recipe=gridsim_grpo", f"trainer.threads={threads}",
                                   f"trainer.steps={grpo_steps}", "trainer.eval_every=0", "trainer.eval_limit=8",
                                   "trainer.checkpoint_every=0", f"trainer.warm_start.checkpoint={warm}"], extra)
                    log = agentrl(root / f"sft-{tag}", [
                        "+recipe=gridsim_sft", f"trainer.threads={threads}", f"trainer.steps={sft_steps}",
                        "trainer.eval_every=0", "trainer.eval_limit=8", "trainer.augment=0"], extra)
                    got = results.setdefault((name, busy), {"grpo": [], "sft": []})
                    got["grpo"].append(grpo_step_times(home)["step"])
                    got["sft"].append(sft_seconds(log, sft_steps))
                    print(f"round {r + 1}, {'beside a busy process' if busy else 'alone'}, {name}: GRPO step "
                          f"{got['grpo'][-1]:.2f} s, SFT {got['sft'][-1]:.0f} s (load {os.getloadavg()[0]:.1f})",
                          flush=True)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()
    print(f"\n| setting | SFT {sft_steps} steps alone | beside one busy process | slowdown | GRPO step alone | "
          "beside | slowdown |\n|---|---|---|---|---|---|---|")
    for name in settings:
        alone, busy = results[(name, False)], results[(name, True)]
        s0, s1 = statistics.fmean(alone["sft"]), statistics.fmean(busy["sft"])
        g0, g1 = statistics.fmean(alone["grpo"]), statistics.fmean(busy["grpo"])
        print(f"| {name} | {s0:.0f} s | {s1:.0f} s | {s1 / s0:.2f}x | {g0:.2f} s | {g1:.2f} s | {g1 / g0:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm-start", help="SFT folder GRPO starts from (default: the recipe's, made once)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--grpo-steps", type=int, default=25)
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--contended", action="store_true", help="slowdown beside one busy process (see above)")
    ap.add_argument("--settings", default=None,
                    help=f"--contended: names separated by ';' among {'; '.join(CONTENDED_SETTINGS)} (default: all)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="agentrl-bench-threads-"))
    warm = args.warm_start
    if warm is None:  # one warm start for every GRPO run: made by the recipe, found by its settings hash
        agentrl(root / "warm", ["+recipe=gridsim_grpo", "trainer.steps=0", "trainer.eval_limit=4"])
        warm = str(next((root / "warm").rglob("checkpoints/sft/*/config.json")).parent)
    if args.contended:
        contended(root, warm, args.rounds, args.grpo_steps, args.sft_steps,
                  [n.strip() for n in args.settings.split(";")] if args.settings else None)
        return
    grpo: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    sft: dict[int, list[float]] = {0: [], 1: []}
    for r in range(args.rounds):
        for threads in (0, 1):
            home = root / f"grpo-{r}-{threads}"
            agentrl(home, ["+recipe=gridsim_grpo", f"trainer.threads={threads}", f"trainer.steps={args.grpo_steps}",
                           "trainer.eval_every=0", "trainer.eval_limit=8", "trainer.checkpoint_every=0",
                           f"trainer.warm_start.checkpoint={warm}"])
            grpo[threads].append(grpo_step_times(home))
            log = agentrl(root / f"sft-{r}-{threads}", [
                "+recipe=gridsim_sft", f"trainer.threads={threads}", f"trainer.steps={args.sft_steps}",
                "trainer.eval_every=0", "trainer.eval_limit=8", "trainer.augment=0"])
            sft[threads].append(sft_seconds(log, args.sft_steps))
            print(f"round {r + 1}, threads={threads}: GRPO {grpo[threads][-1]}, SFT {sft[threads][-1]:.0f}s", flush=True)

    def mean(runs: list[dict[str, float]], key: str) -> float:
        return statistics.fmean(run[key] for run in runs)

    print(f"\nGRPO step (mean of steps 2-{args.grpo_steps}, {args.rounds} runs each), s: default threads -> 1 thread")
    for key in ("step", "generate", "train"):
        a, b = mean(grpo[0], key), mean(grpo[1], key)
        print(f"  {key:9s} {a:.3f} -> {b:.3f}  ({a / b:.2f}x)")
    a, b = statistics.fmean(sft[0]), statistics.fmean(sft[1])
    print(f"SFT, {args.sft_steps} steps of 32 transcripts, s: default threads {a:.0f} -> 1 thread {b:.0f}  ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
