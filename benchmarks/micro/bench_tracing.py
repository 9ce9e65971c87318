"""Episode traces' cost: the flagship's GRPO step untraced vs traced (`logger.trace_train_fraction`), in one run.

    python benchmarks/micro/bench_tracing.py --rounds 2 --steps 8

Runs `python -m agentrl +recipe=gridsim_grpo` as a user would, all runs under one home (the first builds the
SFT warm start, the others reuse it), alternating the settings so that all see the same machine load: 0 (no
training play traced), the default 0.02, and 1 (every training play traced: 64 traces a step, the worst case).
Reads each run's `time/step_s` (steps 2..: step 1 has nothing to overlap) from the MLflow store and prints
the mean per setting and its ratio to the untraced step. Evals are off (every eval play is traced either way).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from mlflow import MlflowClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_threads import agentrl  # noqa: E402 - the sibling benchmark's runner

SETTINGS = (0.0, 0.02, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="agentrl-bench-tracing-"))
    step_s: dict[float, list[float]] = {s: [] for s in SETTINGS}
    traces: dict[float, list[int]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        for fraction in SETTINGS:
            name = f"tracing-{fraction}-{r}"
            agentrl(home, ["+recipe=gridsim_grpo", f"logger.trace_train_fraction={fraction}",
                           f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.checkpoint_every=0",
                           f"logger.run_name={name}", *args.overrides])
            client = MlflowClient(tracking_uri=f"sqlite:///{home / 'outputs' / 'mlflow.db'}")
            [run] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                       filter_string=f"attributes.run_name = '{name}'")
            times = [m.value for m in client.get_metric_history(run.info.run_id, "time/step_s") if m.step > 1]
            step_s[fraction].append(statistics.fmean(times))
            traces[fraction].append(len(client.search_traces(locations=[run.info.experiment_id],
                                                             run_id=run.info.run_id, max_results=5000)))
            print(f"round {r + 1}, trace_train_fraction={fraction}: step {step_s[fraction][-1]:.3f} s, "
                  f"{traces[fraction][-1]} traces", flush=True)
    base = statistics.fmean(step_s[0.0])
    print(f"\nGRPO step (time/step_s), mean of steps 2-{args.steps} over {args.rounds} runs each:")
    for fraction in SETTINGS:
        mean = statistics.fmean(step_s[fraction])
        print(f"  trace_train_fraction={fraction:<5} {mean:.3f} s  ({mean / base:.3f}x untraced), "
              f"{statistics.fmean(traces[fraction]):.0f} traces a run")


if __name__ == "__main__":
    main()
