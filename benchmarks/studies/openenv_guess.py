"""Does the documented OpenEnv example learn? (issue 27; results in benchmarks/RESULTS.md, "The OpenEnv example
learns").

    python benchmarks/studies/openenv_guess.py --home H --seeds 0 1 2

For each seed, runs the real CLI (`python -m agentrl +recipe=openenv_guess seed=S`) in a subprocess: the recipe
serves the example (`agentrl.envs.bundles.openenv_remote.example`: openenv-core's own app, a real server; `env.serve`),
makes its SFT warm start from the bisection teacher's plays of that server, then runs GRPO. Afterwards the
untrained model, the run's warm start and its final model are each evaluated with the trainer's own evaluator on
every eval task (seed) with the same sampling seeds, at the recipe's temperature, and the paired per-task
difference (final - untrained, and final - warm start) ± its standard error is printed. Extra Hydra overrides go
after `--`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from algorithms import cli, mean_se  # noqa: E402 - the sibling benchmarks' helpers
from environments import scores  # noqa: E402
from learning import plan_for  # noqa: E402

from agentrl.testing.config import compose_config  # noqa: E402

RECIPE = "openenv_guess"


def paired(after: dict[int, float], before: dict[int, float]) -> tuple[list[float], str]:
    """The per-task differences (after - before) and them as `mean ± se (n se)`."""
    diffs = [after[i] - before[i] for i in sorted(set(after) & set(before))]
    d, se = mean_se(diffs)
    return diffs, f"{d:+.3f} ± {se:.3f}" + (f" ({d / se:.1f} se)" if se else " (every task alike)")


def run(args: argparse.Namespace, extra: list[str]) -> None:
    home = Path(args.home).absolute()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AGENTRL_HOME"] = str(home)
    from agentrl.trainers.sft.warm_start import warm_start_path

    rows, pooled = [], []
    for seed in args.seeds:
        run_dir = home / RECIPE / f"seed-{seed}"
        overrides = [f"+recipe={RECIPE}", f"seed={seed}", *extra]
        if not (run_dir / "final_model" / "config.json").is_file():  # trained once; later calls only evaluate
            wall = cli(home, [*overrides, f"hydra.run.dir={run_dir}"], home / f"{RECIPE}-seed-{seed}.log", 0)
            (run_dir / "wall_s.txt").write_text(f"{wall:.1f}\n")
        wall = float((run_dir / "wall_s.txt").read_text())
        cfg = compose_config(*overrides)
        plan = plan_for(cfg, home / "run-eval")  # serves the example again, here (the data key is the app's)
        start = warm_start_path(plan)  # the run's own warm start (made by the run, reused here)
        base = plan.model.path()  # the base model the warm start started from
        m_base, untrained = scores(cfg, plan, base, seed)
        m_start, warm = scores(cfg, plan, start, seed)
        m_final, final = scores(cfg, plan, str(run_dir / "final_model"), seed)
        diffs, vs_untrained = paired(final, untrained)
        _, vs_warm = paired(final, warm)
        pooled.append(diffs)
        rows.append(f"| {seed} | {m_base['eval/reward']:.3f} | {m_start['eval/reward']:.3f} | "
                    f"{m_final['eval/reward']:.3f} ± {m_final['eval/reward_stderr']:.3f} | {vs_untrained} | "
                    f"{vs_warm} | {len(diffs)} | {wall / 60:.1f} |")
        print(rows[-1], flush=True)
    temp = float(compose_config(*[f"+recipe={RECIPE}", *extra]).trainer.temperature)
    print(f"\n## {RECIPE}: untrained vs warm start vs after the recipe, paired per eval task, sampled at T={temp}\n")
    print("| seed | untrained | warm start | after ± se | after - untrained ± se | after - warm start ± se | "
          "tasks | run wall min |")
    print("|---" * 8 + "|")
    print("\n".join(rows))
    if len(pooled) > 1:
        n = min(len(p) for p in pooled)
        d, se = mean_se([sum(p[i] for p in pooled) / len(pooled) for i in range(n)])
        print(f"\nmean over {len(pooled)} seeds, paired per task (after - untrained): {d:+.4f} ± {se:.4f}: "
              f"{'PASS' if d > 2 * se else 'FAIL'} (> 2 se)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="output root (runs, warm starts, MLflow store)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args, extra = ap.parse_known_args()
    if extra and extra[0] == "--":
        extra = extra[1:]
    run(args, extra)


if __name__ == "__main__":
    main()
