"""`trainer.max_staleness=K`: the flagship's GRPO step at K = 0, 1, 2 (issue 31), as ratios to K = 0.

    python benchmarks/micro/bench_staleness.py --warm-start PATH --rounds 2 --steps 12 [--ks 0,1,2] [OVERRIDES]

Runs `python -m agentrl +recipe=gridsim_grpo` (or `--recipe`) as a user would from one SFT folder, the settings
alternating within each round so that they see the same machine load, and reads each run's own MLflow store (steps 2..: step 1 is
played then trained at every K). Prints per K the mean seconds of a step, of what it waited for its plays, of the
update, the learner's and the engine's idle fractions and the staleness, then each step time as a ratio to K=0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_threads import agentrl, metric_means  # noqa: E402 - the sibling benchmark's runner and reader

KEYS = {"step_s": "time/step_s", "wait_s": "time/generate_wait_s", "train_s": "time/train_s",
        "learner_idle": "async/learner_idle", "engine_idle": "async/engine_idle",
        "producer_idle": "async/producer_idle", "staleness": "async/staleness_mean"}


def step_means(home: Path) -> dict[str, float]:
    """Mean of each metric over steps 2.. of the one run under `home` (nan: not logged)."""
    means = metric_means(home, KEYS.values())
    return {name: means[key] for name, key in KEYS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm-start", required=True, help="the SFT folder every run starts from")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ks", default="0,1,2", help="the K values, comma-separated (the first is the baseline)")
    ap.add_argument("--recipe", default="gridsim_grpo", help="the recipe every run trains (e.g. gridsim_beat_teacher)")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    root = Path(tempfile.mkdtemp(prefix="agentrl-bench-staleness-"))
    runs: dict[int, list[dict[str, float]]] = {k: [] for k in ks}
    for r in range(args.rounds):
        for k in ks:
            home = root / f"grpo-{r}-{k}"
            agentrl(home, [f"+recipe={args.recipe}", f"trainer.max_staleness={k}", f"trainer.steps={args.steps}",
                           "trainer.eval_every=0", "trainer.eval_limit=8", "trainer.checkpoint_every=0",
                           f"trainer.warm_start.checkpoint={args.warm_start}", *args.overrides])
            runs[k].append(step_means(home))
            print(f"round {r + 1}, K={k}: " + ", ".join(f"{n} {v:.3f}" for n, v in runs[k][-1].items()), flush=True)
    print(f"\nGRPO step, mean of steps 2-{args.steps} over {args.rounds} runs per K:")
    print("  K  " + "  ".join(f"{n:>13s}" for n in KEYS) + "   step / K=" + str(ks[0]))
    base = statistics.fmean(run["step_s"] for run in runs[ks[0]])
    for k in ks:
        means = {n: statistics.fmean(run[n] for run in runs[k]) for n in KEYS}
        print(f"  {k}  " + "  ".join(f"{means[n]:13.3f}" for n in KEYS) + f"   {means['step_s'] / base:.2f}x")


if __name__ == "__main__":
    main()
