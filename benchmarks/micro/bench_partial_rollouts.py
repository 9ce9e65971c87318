"""Partial rollouts and the engine in its own process (issue 31, proof 3): time per GRPO step, the engine's idle
share and the plays' long tail, with and without `trainer.partial_rollouts`, with the engine in this process or in
its own.

    python benchmarks/micro/bench_partial_rollouts.py --warm-start PATH --rounds 1 --steps 8
    python benchmarks/micro/bench_partial_rollouts.py --recipe openenv_guess --warm-start PATH --rounds 2 --steps 16

Runs `python -m agentrl +recipe=RECIPE trainer.max_staleness=K` (default gridsim_grpo, K=1) from one SFT folder
in four settings, interleaved per round so each sees the same machine load: pushes that wait for the running
replies or keep them (partial rollouts), each with `inference.process` false and true. Reads each run's MLflow
store: the mean `time/step_s`, `async/engine_idle` (the share of the step the engine had no sequence running),
`rollout/tail_share` (the share of the step's play after half its episodes had ended: the engine serving a
shrinking batch while the step waits for its slowest episodes) and `async/resumed_partial` over steps 2.. (step 1
has nothing played ahead). Prints the ratios against the default (wait, in-process), all measured in this one
invocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_threads import agentrl, metric_means  # noqa: E402 - the sibling benchmark's runner and reader

SETTINGS = {  # name -> overrides
    "wait, in-process": ["trainer.partial_rollouts=false", "inference.process=false"],
    "keep, in-process": ["trainer.partial_rollouts=true", "inference.process=false"],
    "wait, own process": ["trainer.partial_rollouts=false", "inference.process=true"],
    "keep, own process": ["trainer.partial_rollouts=true", "inference.process=true"],
}
KEYS = ("time/step_s", "async/engine_idle", "rollout/tail_share", "async/resumed_partial")


def means(home: Path) -> dict[str, float]:
    """Mean of each of KEYS over steps 2.. of the one run under `home` (nan where it was not logged)."""
    return metric_means(home, KEYS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm-start", required=True, help="the SFT folder every run starts from")
    ap.add_argument("--recipe", default="gridsim_grpo", help="a multi-turn one (openenv_guess) has long tails")
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="agentrl-bench-partial-"))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for i, (name, overrides) in enumerate(SETTINGS.items()):
            home = root / f"run-{r}-{i}"
            agentrl(home, [f"+recipe={args.recipe}", f"trainer.max_staleness={args.max_staleness}",
                           f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.eval_limit=4",
                           "trainer.checkpoint_every=0", f"trainer.warm_start.checkpoint={args.warm_start}",
                           *overrides, *args.overrides])
            runs[name].append(means(home))
            print(f"round {r + 1}, {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[name][-1].items()),
                  flush=True)
    base = "wait, in-process"
    print(f"\n{args.recipe} GRPO step at max_staleness={args.max_staleness}, mean of steps 2-{args.steps} over "
          f"{args.rounds} round(s):")
    for name in SETTINGS:
        step, idle, tail, resumed = (statistics.fmean(run[k] for run in runs[name]) for k in KEYS)
        ratio = step / statistics.fmean(run["time/step_s"] for run in runs[base])
        print(f"  {name:18s} step {step:.3f} s ({ratio:.2f}x {base}), engine idle {idle:.2f}, play's tail "
              f"{tail:.2f}, resumed partial rollouts {resumed:.2f} a step")


if __name__ == "__main__":
    main()
