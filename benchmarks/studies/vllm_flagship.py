"""Does training through vLLM give the same model? The flagship run with each engine, compared paired per day.

    # the two runs (same home, so the second reuses the first's warm start), one at a time:
    AGENTRL_HOME=H python -m agentrl +recipe=gridsim_grpo
    AGENTRL_HOME=H python -m agentrl +recipe=gridsim_grpo inference=vllm
    # then:
    AGENTRL_HOME=H python benchmarks/studies/vllm_flagship.py --embedded RUN_DIR --vllm RUN_DIR

Both final models (`RUN_DIR/final_model`) are played on all 200 eval days by one evaluator (the embedded engine,
the same seeds for both), sampled at the recipe's temperature and greedy-decoded; the verdict is the paired
per-day difference against one standard error. From each run's MLflow record it also prints the run's own final
evals, its seconds per step, weight push and rollout wait, and the learner-vs-engine logprob gap over its steps.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from agentrl.paired import paired_diff  # noqa: E402
from agentrl.testing.config import compose_config  # noqa: E402

HISTORY = ("train/logprob_gap_mean", "train/logprob_gap_max", "time/step_s", "time/weight_push_s",
           "time/generate_wait_s", "time/train_s")
FINAL = ("eval/reward", "eval_greedy/reward")


def run_record(run_dir: Path) -> dict[str, Any]:
    """The MLflow run logged for `run_dir`: its final evals and the per-step history of HISTORY."""
    import mlflow

    from agentrl.config.locate import project_root

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'outputs' / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string=f"tags.`agentrl.run_dir` = '{run_dir}'")
    if not runs:
        raise SystemExit(f"no MLflow run in {uri} has agentrl.run_dir={run_dir}")
    run = runs[0]
    out: dict[str, Any] = {k: run.data.metrics.get(k, math.nan) for k in FINAL}
    for key in HISTORY:
        out[key] = [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
    return out


def play_all(cfg: Any, model_path: str, temperature: float | None) -> list[float]:
    """Per-day scores of `model_path` on every eval day: sampled at `temperature`, or greedy when None."""
    from agentrl.plan import build_plan
    from agentrl.play.evaluate import evaluate
    from agentrl.play.services import start_services

    plan = build_plan(cfg, choices={}, run_dir=Path(model_path).parent / "study")
    svc = start_services(plan, model_path)
    try:
        sampling = plan.sampling.greedy_copy() if temperature is None else plan.sampling.at(temperature)
        _, played = evaluate(svc, plan.bundle, cfg.env.eval_split, limit=None, sampling=sampling,
                             seed_parts=(cfg.seed, "vllm_flagship"), quiet=True)
    finally:
        svc.close()
    return [p.score for p in played]


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean and standard error of b - a, paired per day (`agentrl.paired.paired_diff`)."""
    d = paired_diff(b, a)
    return d.mean, d.se


def describe(name: str, xs: list[float]) -> str:
    if not xs:
        return f"{name}: not logged"
    return (f"{name}: mean {statistics.fmean(xs):.4f}, median {statistics.median(xs):.4f}, max {max(xs):.4f}, "
            f"first {xs[0]:.4f}, last {xs[-1]:.4f} ({len(xs)} steps)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embedded", required=True, type=Path, help="the run folder of the run with inference=embedded")
    ap.add_argument("--vllm", required=True, type=Path, help="the run folder of the run with inference=vllm")
    ap.add_argument("--records-only", action="store_true",
                    help="print the MLflow records (a run still going: its steps so far), skip the paired eval")
    args = ap.parse_args()
    runs = {"embedded": args.embedded.resolve(), "vllm": args.vllm.resolve()}
    for name, run_dir in runs.items():
        if not args.records_only and not (run_dir / "final_model" / "config.json").is_file():
            raise SystemExit(f"--{name}: {run_dir} has no final_model (did the run finish?)")

    for name, run_dir in runs.items():
        rec = run_record(run_dir)
        print(f"\n## {name}: {run_dir}\nrun's own final eval: sampled {rec['eval/reward']:.3f}, greedy-decoded "
              f"{rec['eval_greedy/reward']:.3f}")
        for key in HISTORY:
            print(describe(key, rec[key]))
    if args.records_only:
        return

    cfg = compose_config("+recipe=gridsim_grpo")
    temperature = float(cfg.trainer.temperature)
    print("\n## Both final models on all eval days, one evaluator (embedded engine), paired per day")
    print("| decoding | embedded-trained | vLLM-trained | vLLM - embedded (paired) | within 1 se |\n|---|---|---|---|---|")
    for label, t in ((f"sampled T={temperature}", temperature), ("greedy", None)):
        scores = {name: play_all(cfg, str(run_dir / "final_model"), t) for name, run_dir in runs.items()}
        mean, se = paired(scores["embedded"], scores["vllm"])
        print(f"| {label} | {statistics.fmean(scores['embedded']):.3f} | {statistics.fmean(scores['vllm']):.3f} | "
              f"{mean:+.3f} ± {se:.3f} | {'yes' if abs(mean) <= se else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
