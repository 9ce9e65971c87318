"""`trainer.max_staleness` 0 vs 1 (formerly `trainer.off_policy_steps`): the flagship's GRPO step played then trained (0) vs overlapped (1).

    python benchmarks/micro/bench_overlap.py --warm-start PATH --rounds 2 --steps 30

Runs `python -m agentrl +recipe=gridsim_grpo` as a user would from one SFT folder, alternating the two settings
so that both see the same machine load, and reads each run's step times from its own MLflow store (steps 2..:
step 1 is played then trained either way). Prints per setting the mean seconds of a step, of its plays, of the
part of the plays the step waited for, and of the update, then the ratio overlapped / played-then-trained.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_threads import agentrl, metric_means  # noqa: E402 - the sibling benchmark's runner and reader

KEYS = ("step", "generate", "generate_wait", "train")


def step_times(home: Path) -> dict[str, float]:
    """Mean seconds of a GRPO step and its parts over steps 2.. of the one run under `home`."""
    means = metric_means(home, [f"time/{key}_s" for key in KEYS])
    out = {key: means[f"time/{key}_s"] for key in KEYS}
    if out["generate_wait"] != out["generate_wait"]:  # a run that did not log waits waited for all of its plays
        out["generate_wait"] = out["generate"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm-start", required=True, help="the SFT folder every run starts from")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="agentrl-bench-overlap-"))
    runs: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for r in range(args.rounds):
        for setting in (0, 1):
            home = root / f"grpo-{r}-{setting}"
            agentrl(home, ["+recipe=gridsim_grpo", f"trainer.max_staleness={setting}", f"trainer.steps={args.steps}",
                           "trainer.eval_every=0", "trainer.eval_limit=8", "trainer.checkpoint_every=0",
                           f"trainer.warm_start.checkpoint={args.warm_start}", *args.overrides])
            runs[setting].append(step_times(home))
            print(f"round {r + 1}, max_staleness={setting}: " +
                  ", ".join(f"{k} {v:.3f}" for k, v in runs[setting][-1].items()), flush=True)
    print(f"\nGRPO step, mean of steps 2-{args.steps} over {args.rounds} runs each (s): played then trained -> "
          "overlapped")
    for key in KEYS:
        a, b = (statistics.fmean(run[key] for run in runs[s]) for s in (0, 1))
        print(f"  {key:14s} {a:.3f} -> {b:.3f}  ({b / a:.2f}x)")


if __name__ == "__main__":
    main()
