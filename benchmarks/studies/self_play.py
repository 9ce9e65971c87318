"""Issue 33, proof 4: self-play TicTacToe beats the random player (results in benchmarks/RESULTS.md, "Self-play
learns TicTacToe (issue 33)").

    python benchmarks/studies/self_play.py --home H --seeds 0 1 2

Seed 0 runs the real CLI (`python -m agentrl +recipe=textarena_self_play_learns seed=0`), which makes the SFT warm
start on the heuristic teacher and trains; every later seed starts from that same warm start
(`trainer.warm_start.checkpoint=`) and trains with its own seed. Then this script plays the warm start (once) and
each seed's final model with the trainer's own evaluator on the 200 seeded eval matches against the scripted random
player (seats alternating), sampled at the recipe's temperature and greedy-decoded, every model with the same
sampling seeds, and prints each model's wins minus losses per match ± se and the paired per-match difference
(after - start). It also plays each final model against the frozen warm start (`play/checkpoint_match.py`: the
eval split's 200 match seeds played as self-play, seats alternating; 0.5 is a tie). Extra Hydra overrides go
after `--`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from algorithms import cli, mean_se  # noqa: E402 - the sibling benchmarks' helpers
from environments import scores  # noqa: E402
from learning import plan_for  # noqa: E402

from agentrl.testing.config import compose_config  # noqa: E402

RECIPE = "textarena_self_play_learns"


def wml(per_match: dict[int, float]) -> str:
    """Wins minus losses per match ± se (a match's 2 x score - 1) and its size in se."""
    m, se = mean_se([2 * v - 1 for v in per_match.values()])
    return f"{m:+.3f} ± {se:.3f} ({m / se if se else float('nan'):.1f} se)"


def stamped(model: str) -> str:
    """`model` and when its weights were written: a folder trained again under the same name is evaluated again."""
    weights = sorted(Path(model).glob("*.safetensors"))
    return f"{model}@{max((w.stat().st_mtime_ns for w in weights), default=0)}"


def cached(home: Path, key: str, play, *args, **kwargs):
    """`play(*args, **kwargs)`'s (metrics, score per match), kept in `home/self_play_evals.json` under `key`: a later call (more
    seeds, the final table) reuses an evaluation instead of playing it again. Keys name the models with `stamped` and
    the study's overrides; the store is replaced whole, so a killed study never leaves it half written."""
    store = home / "self_play_evals.json"
    known = json.loads(store.read_text()) if store.is_file() else {}
    if key not in known:
        metrics, per_match = play(*args, **kwargs)
        known = json.loads(store.read_text()) if store.is_file() else {}
        known[key] = [metrics, {str(i): v for i, v in per_match.items()}]
        partial = store.with_suffix(".json.partial")
        partial.write_text(json.dumps(known, indent=1))
        partial.replace(store)
    metrics, per_match = known[key]
    return metrics, {int(i): float(v) for i, v in per_match.items()}


def paired(before: dict[int, float], after: dict[int, float]) -> tuple[list[float], str]:
    diffs = [after[i] - before[i] for i in sorted(set(before) & set(after))]
    d, se = mean_se(diffs)
    return diffs, f"{d:+.3f} ± {se:.3f} ({d / se if se else float('nan'):.1f} se)"


def train(home: Path, seed: int, extra: list[str], threads: int, warm: str) -> tuple[Path, float]:
    """The seed's run folder (trained now unless it holds a final model) and its wall seconds."""
    run_dir = home / "self_play" / f"seed-{seed}"
    overrides = [f"+recipe={RECIPE}", f"seed={seed}", *extra]
    if seed != 0:
        overrides.append(f"trainer.warm_start.checkpoint={warm}")
    if not (run_dir / "final_model" / "config.json").is_file():  # trained once; later calls only evaluate
        wall = cli(home, [*overrides, f"hydra.run.dir={run_dir}"], home / f"self_play-seed-{seed}.log", threads)
        (run_dir / "wall_s.txt").write_text(f"{wall:.1f}\n")
    wall_file = run_dir / "wall_s.txt"
    return run_dir, float(wall_file.read_text()) if wall_file.is_file() else float("nan")


def run(args: argparse.Namespace, extra: list[str]) -> None:
    home = Path(args.home).absolute()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AGENTRL_HOME"] = str(home)
    from agentrl.play.checkpoint_match import checkpoint_matches
    from agentrl.trainers.sft.warm_start import warm_start_path

    # Seed 0's own warm start (made here if missing; its run reuses it); the later seeds start from it.
    warm = warm_start_path(plan_for(compose_config(*[f"+recipe={RECIPE}", "seed=0", *extra]), home / "run-start"))
    start: dict[str, tuple[dict[str, float], dict[int, float]]] = {}  # the warm start's evals, made once
    overrides = " ".join(extra)  # part of every cache key: other eval settings, other results
    rows, greedy_rows, vs_rows = [], [], []
    pooled: dict[str, list[list[float]]] = {"sampled": [], "greedy": []}
    for seed in args.seeds:
        run_dir, wall = train(home, seed, extra, args.threads, warm)
        cfg = compose_config(*[f"+recipe={RECIPE}", f"seed={seed}", *extra])
        plan = plan_for(cfg, home / "run-eval")
        final = str(run_dir / "final_model")
        for label, temperature, table in (("sampled", None, rows), ("greedy", 0.0, greedy_rows)):
            # Every model samples with the sampling seeds of eval seed 0: paired by match and by draw.
            if label not in start:
                start[label] = cached(home, f"{stamped(warm)}|{label}|{overrides}", scores, cfg, plan, warm, 0, temperature)
            m0, before = start[label]
            m1, after = cached(home, f"{stamped(final)}|{label}|{overrides}", scores, cfg, plan, final, 0, temperature)
            diffs, diff = paired(before, after)
            pooled[label].append(diffs)
            table.append(f"| {seed} | {m0['eval/reward']:.3f} | {wml(before)} | {m1['eval/reward']:.3f} | "
                         f"{wml(after)} | {diff} | {len(diffs)} |" + (f" {wall / 60:.1f} |" if label == "sampled" else ""))
            print(table[-1], flush=True)
        vs_cfg = compose_config(*[f"+recipe={RECIPE}", f"seed={seed}", "env.eval_opponent=null", *extra])
        vs_plan = plan_for(vs_cfg, home / "run-eval-vs")
        vm, per_match = cached(home, f"{stamped(final)}|vs|{stamped(warm)}|{overrides}", checkpoint_matches, vs_plan, final, warm,
                                 sampling=vs_plan.sampling, seed_parts=(seed, "env-bench"))
        vs_rows.append(f"| {seed} | {vm['checkpoint/reward']:.3f} ± {vm['checkpoint/reward_stderr']:.3f} | "
                       f"{wml(per_match)} | {vm['checkpoint/win_share']:.3f} / {vm['checkpoint/draw_share']:.3f} / "
                       f"{vm['checkpoint/loss_share']:.3f} | {vm['checkpoint/reward_seat0']:.3f} | "
                       f"{vm['checkpoint/reward_seat1']:.3f} | {len(per_match)} |")
        print(vs_rows[-1], flush=True)
    temp = float(compose_config(*[f"+recipe={RECIPE}", *extra]).trainer.temperature)
    head = ("| seed | start score | start wins - losses ± se | after score | after wins - losses ± se | "
            "paired after - start ± se | matches |")
    print(f"\n## {RECIPE} against the random player, sampled at T={temp}\n\n{head} run wall min |")
    print("|---" * 8 + "|\n" + "\n".join(rows))
    print(f"\ngreedy-decoded (T=0)\n\n{head}\n" + "|---" * 7 + "|\n" + "\n".join(greedy_rows))
    print(f"\nafter self-play against the frozen warm start, sampled at T={temp}\n")
    print("| seed | score ± se | wins - losses ± se | win / draw / loss | as seat 0 | as seat 1 | matches |")
    print("|---" * 7 + "|\n" + "\n".join(vs_rows))
    for label, runs in pooled.items():
        if len(runs) > 1:
            n = min(len(r) for r in runs)
            d, se = mean_se([sum(r[i] for r in runs) / len(runs) for i in range(n)])
            print(f"\n{label}: after - start over {len(runs)} seeds, paired per match: {d:+.4f} ± {se:.4f} "
                  f"({d / se if se else float('nan'):.1f} se)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="output root (runs, the warm start, MLflow store)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1)
    args, extra = ap.parse_known_args()
    if extra and extra[0] == "--":
        extra = extra[1:]
    run(args, extra)


if __name__ == "__main__":
    main()
