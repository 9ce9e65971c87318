"""Issue 19's learning results for the reasoning-gym and TextArena routes, one command each (results in
benchmarks/RESULTS.md, "Environments (issue 19)", and docs/environments.md, "Measured").

    python benchmarks/studies/environments.py reasoning_gym --home H --seeds 0 1 2   # GRPO gain over the warm start
    python benchmarks/studies/environments.py textarena --home H --seeds 0           # self-play vs a scripted random player

Each seed is the real CLI (`python -m agentrl +recipe=<recipe> seed=S`) in a subprocess, which makes its SFT warm
start and trains; then this script evaluates the warm start and the final model with the trainer's own evaluator
on the same eval tasks with the same sampling seeds (`seed_parts`), at the recipe's temperature, and prints the
paired per-task difference (after - start) ± its standard error. Extra Hydra overrides go after `--`, e.g.
`... reasoning_gym --home H --seeds 0 -- trainer.steps=10 env.eval_size=50` for a quick look.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from algorithms import cli, mean_se  # noqa: E402 - the sibling benchmarks' helpers
from learning import plan_for  # noqa: E402

from agentrl.testing.config import compose_config  # noqa: E402

RECIPES = {"reasoning_gym": "reasoning_gym_grpo", "textarena": "textarena_self_play"}


def scores(cfg, plan, model_path: str, seed: int, temperature: float | None = None
           ) -> tuple[dict[str, float], dict[int, float]]:
    """The trainer's eval of `model_path` on every eval task at the recipe's temperature (or `temperature`; 0:
    greedy), sampling seeds fixed by (seed, "env-bench"): metrics and the score per eval task index."""
    from agentrl.play.evaluate import evaluate
    from agentrl.play.services import start_services

    svc = start_services(plan, model_path)
    try:
        sampling = plan.sampling if temperature is None else plan.sampling.at(temperature)
        metrics, played = evaluate(svc, plan.bundle, cfg.env.eval_split, limit=None, sampling=sampling,
                                   seed_parts=(seed, "env-bench"), quiet=True)
    finally:
        svc.close()
    return metrics, {int(p.row["metadata"]["index"]): float(p.score) for p in played}


def run(args: argparse.Namespace, extra: list[str]) -> None:
    recipe = RECIPES[args.route]
    home = Path(args.home).absolute()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AGENTRL_HOME"] = str(home)
    from agentrl.trainers.sft.warm_start import warm_start_path

    rows, pooled, greedy = [], [], []
    for seed in args.seeds:
        run_dir = home / f"{args.route}{args.tag}" / f"seed-{seed}"
        overrides = [f"+recipe={recipe}", f"seed={seed}", *extra]
        if not (run_dir / "final_model" / "config.json").is_file():  # trained once; later calls only evaluate
            wall = cli(home, [*overrides, f"hydra.run.dir={run_dir}"], home / f"{args.route}{args.tag}-seed-{seed}.log",
                       args.threads)
            (run_dir / "wall_s.txt").write_text(f"{wall:.1f}\n")
        wall = float((run_dir / "wall_s.txt").read_text()) if (run_dir / "wall_s.txt").is_file() else float("nan")
        cfg = compose_config(*overrides)
        plan = plan_for(cfg, home / "run-eval")
        start = warm_start_path(plan)  # the run's own warm start (made by the run, reused here)
        m0, before = scores(cfg, plan, start, seed)
        m1, after = scores(cfg, plan, str(run_dir / "final_model"), seed)
        common = sorted(set(before) & set(after))
        diffs = [after[i] - before[i] for i in common]
        d, se = mean_se(diffs)
        pooled.append(diffs)
        extra_cols = ""
        if args.route == "textarena":
            extra_cols = (f" | {m0.get('eval/reward_seat0', float('nan')):.3f} -> "
                          f"{m1.get('eval/reward_seat0', float('nan')):.3f} | "
                          f"{m0.get('eval/reward_seat1', float('nan')):.3f} -> "
                          f"{m1.get('eval/reward_seat1', float('nan')):.3f}")
        rows.append(f"| {seed} | {m0['eval/reward']:.3f} ± {m0['eval/reward_stderr']:.3f} | "
                    f"{m1['eval/reward']:.3f} ± {m1['eval/reward_stderr']:.3f} | {d:+.3f} ± {se:.3f} "
                    f"({d / se if se else float('nan'):.1f} se){extra_cols} | {len(common)} | {wall / 60:.1f} |")
        print(rows[-1], flush=True)
        if args.route == "textarena":  # greedy-decoded too: the scripted opponent's moves still vary by match seed
            g0, gb = scores(cfg, plan, start, seed, 0.0)
            g1, ga = scores(cfg, plan, str(run_dir / "final_model"), seed, 0.0)
            gd, gse = mean_se([ga[i] - gb[i] for i in sorted(set(ga) & set(gb))])
            greedy.append(f"| {seed} | {g0['eval/reward']:.3f} ± {g0['eval/reward_stderr']:.3f} | "
                          f"{g1['eval/reward']:.3f} ± {g1['eval/reward_stderr']:.3f} | {gd:+.3f} ± {gse:.3f} |")
            print(greedy[-1], flush=True)
    temp = float(compose_config(*[f"+recipe={recipe}", *extra]).trainer.temperature)
    print(f"\n## {recipe}: warm start vs after GRPO, paired per eval task, sampled at T={temp}\n")
    seats = " | seat 0 start -> after | seat 1 start -> after" if args.route == "textarena" else ""
    print(f"| seed | start ± se | after ± se | paired diff ± se{seats} | tasks | run wall min |")
    print("|---" * (8 if seats else 6) + "|")
    print("\n".join(rows))
    if greedy:
        print("\ngreedy-decoded (T=0), paired per match:\n\n| seed | start ± se | after ± se | paired diff ± se |")
        print("|---|---|---|---|")
        print("\n".join(greedy))
    if len(pooled) > 1:
        n = min(len(p) for p in pooled)
        avg = [sum(p[i] for p in pooled) / len(pooled) for i in range(n)]
        d, se = mean_se(avg)
        print(f"\nmean over {len(pooled)} seeds, paired per task: {d:+.4f} ± {se:.4f} "
              f"({d / se if se else float('nan'):.1f} se): {'PASS' if d > 2 * se else 'FAIL'} (> 2 se)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("route", choices=sorted(RECIPES))
    ap.add_argument("--home", required=True, help="output root (runs, warm starts, MLflow store)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="", help="suffix for the run folders (several settings in one home)")
    args, extra = ap.parse_known_args()
    if extra and extra[0] == "--":
        extra = extra[1:]
    run(args, extra)


if __name__ == "__main__":
    main()
