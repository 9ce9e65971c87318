"""Issue 16's learning proofs, one command each (results in benchmarks/RESULTS.md, "Algorithms").

    python benchmarks/studies/algorithms.py start   --home H                     # the greedy rule's imitation (SFT), once
    python benchmarks/studies/algorithms.py beat    --home H --seeds 0 1 2       # (1) RL beats its teacher, paired per day
    python benchmarks/studies/algorithms.py compare --home H --seeds 0 1 2 --losses grpo,dr_grpo,dapo,gspo   # (2) multirun
    python benchmarks/studies/algorithms.py flagship --home H                    # (3) the README command, timed
    python benchmarks/studies/algorithms.py temps --home H --temps 1.1 0.8 0.6   # (3) a model's eval by temperature
    python benchmarks/studies/algorithms.py curve --home H --tag=_x --out F.png  # beat's runs: eval vs wall time

Every GRPO run is the real CLI (`python -m agentrl +recipe=gridsim_beat_teacher ...`) in a subprocess, from the
same start folder (`trainer.warm_start.checkpoint`), logging to one MLflow store under H (`H/mlflow.db`). Extra
Hydra overrides go after `--`, e.g. `... beat --home H --seeds 0 -- trainer.steps=20 trainer.eval_limit=20`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import eval_both, plan_for, row  # noqa: E402 - the sibling benchmark's helpers

from agentrl.paired import mean_se as paired_mean_se  # noqa: E402
from agentrl.testing.config import compose_config  # noqa: E402

RECIPE = "gridsim_beat_teacher"
# the PPO ratio's statistics, per run the mean over its steps (docs/training.md, "Several optimizer steps per batch")
RATIO_METRICS = ("train/clip_fraction", "train/approx_kl")


def cli(home: Path, args: Sequence[str], log: Path, threads: int = 1) -> float:
    """Run `python -m agentrl ARGS` with this benchmark's home and MLflow store; returns its wall seconds."""
    env = dict(os.environ, AGENTRL_HOME=str(home), MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}")
    env.pop("OMP_NUM_THREADS", None)
    if threads:  # 0: the run's own choice (the plan's threads line)
        env["OMP_NUM_THREADS"] = str(threads)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "agentrl", *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"agentrl {' '.join(args)} failed ({proc.returncode}); see {log}")
    return time.monotonic() - started


def start_path(home: Path, extra: Sequence[str] = (), recipe: str = RECIPE) -> Path:
    """The folder every run starts from: `recipe`'s warm start at seed 0 (made if missing); for the default
    recipe, the greedy rule's imitation."""
    os.environ["AGENTRL_HOME"] = str(home)
    from agentrl.trainers.sft.warm_start import warm_start_path

    cfg = compose_config(*[f"+recipe={recipe}", "seed=0", *extra])
    return Path(warm_start_path(plan_for(cfg, home / "run-start")))


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for fewer than two values): `agentrl.paired.mean_se`."""
    return paired_mean_se(xs)


def greedy_rule_scores(plan, limit: int | None) -> list[float]:
    """The greedy rule's score on each eval day, in eval order."""
    from agentrl.envs.bundles.gridsim.baselines import baseline_scores

    rows = plan.bundle.rows(plan.settings.env.eval_split)
    return [baseline_scores(r)["greedy"] for r in (rows[:limit] if limit else rows)]


def beat(args: argparse.Namespace, extra: list[str]) -> None:
    """(1) GRPO from the greedy rule's imitation, per seed; the paired per-day difference against the rule."""
    home = Path(args.home)
    # --start: e.g. LoRA runs from the full fine-tuned start (their own warm start would be a LoRA SFT)
    start = Path(args.start) if args.start else start_path(home, extra)
    cfg = compose_config(*[f"+recipe={RECIPE}", *extra])
    limit, temp = cfg.trainer.eval_limit, float(cfg.trainer.temperature)
    plan = plan_for(cfg, home / "run-eval")
    rule = greedy_rule_scores(plan, limit)

    def one(seed: int) -> tuple[int, float, Path]:
        run_dir = home / f"beat{args.tag}" / f"seed-{seed}"
        # The run's own evals may be cut (--cli-eval-limit): the table below comes from this script's evals.
        own = [f"trainer.eval_limit={args.cli_eval_limit}"] if args.cli_eval_limit else []
        if args.reuse and (run_dir / "final_model" / "config.json").is_file():
            print(f"seed {seed}: reusing {run_dir / 'final_model'}", flush=True)
            return seed, float("nan"), run_dir / "final_model"
        wall = cli(home, [f"+recipe={RECIPE}", f"seed={seed}", f"trainer.warm_start.checkpoint={start}",
                          f"hydra.run.dir={run_dir}", *extra, *own], home / f"beat{args.tag}-seed-{seed}.log")
        return seed, wall, run_dir / "final_model"

    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}").search_experiments()  # made once: no racing migrations
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(one, args.seeds))
    per_seed: dict[int, list[float]] = {}
    rows = []
    for seed, wall, model in runs:
        m, rewards = eval_both(compose_config(*[f"+recipe={RECIPE}", f"seed={seed}", *extra]), plan, str(model), limit, temp)
        per_seed[seed] = rewards
        d, se = mean_se([a - b for a, b in zip(rewards, rule, strict=True)])
        by_d = " | ".join(f"{m.get(f'eval/reward_{h}h', float('nan')):.3f}" for h in (1, 2, 4))
        rows.append(f"| {seed} | {by_d} | {m['eval/reward']:.3f} | {m['eval_greedy/reward']:.3f} | "
                    f"{d:+.3f} ± {se:.3f} | {wall / 60:.1f} |")
    m0, r0 = eval_both(cfg, plan, str(start), limit, temp)
    days = len(rule)
    avg = [sum(per_seed[s][i] for s in per_seed) / len(per_seed) for i in range(days)]
    d, se = mean_se([a - b for a, b in zip(avg, rule, strict=True)])
    print(f"\n## (1) GRPO from the greedy rule's imitation, {days} eval days, sampled at T={temp}\n")
    print(f"greedy rule {sum(rule) / days:.3f}; start (SFT on the rule) sampled {m0['eval/reward']:.3f}, "
          f"greedy-decoded {m0['eval_greedy/reward']:.3f}\n")
    print("| seed | 1h | 2h | 4h | sampled | greedy-decoded | paired diff vs the rule (sampled) ± se | wall min |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    sampled = [sum(r) / days for r in per_seed.values()]
    ms, ses = mean_se(sampled)
    verdict = "PASS" if d > 2 * se else "FAIL"
    print(f"\nmean over {len(per_seed)} seeds: {ms:.3f} ± {ses:.3f} (se over seeds); paired per-day difference of "
          f"the seed-mean against the greedy rule: {d:+.4f} ± {se:.4f} ({d / se if se else float('nan'):.1f} se): "
          f"{verdict}")
    d0, se0 = mean_se([a - b for a, b in zip(r0, rule, strict=True)])
    print(f"the start against the greedy rule, paired: {d0:+.4f} ± {se0:.4f}")


def compare(args: argparse.Namespace, extra: list[str]) -> None:
    """(2) One Hydra multirun over losses x seeds (children of one MLflow parent), then its table."""
    home = Path(args.home)
    wall = float("nan")
    if not args.parent:
        start = start_path(home, extra)
        wall = cli(home, ["-m", f"+recipe={RECIPE}", f"trainer.loss={args.losses}",
                          f"seed={','.join(str(s) for s in args.seeds)}", f"trainer.warm_start.checkpoint={start}",
                          f"hydra.sweep.dir={home / ('compare' + args.tag)}", *extra], home / f"compare{args.tag}.log")
    print(compare_table(f"sqlite:///{home / 'mlflow.db'}", args.parent, wall))


def compare_table(uri: str, parent_id: str | None, wall: float) -> str:
    """The newest sweep's (or `parent_id`'s) children by loss: eval reward at each eval step, the last eval by
    battery duration, the final greedy-decoded eval and seconds per step, each mean ± se over the seeds."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    parent = (client.get_run(parent_id) if parent_id else
              client.search_runs(exps, "tags.agentrl.sweep = 'true'", order_by=["attribute.start_time DESC"])[0])
    children = client.search_runs(exps, f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    evals: dict[str, dict[int, list[float]]] = {}
    last: dict[str, dict[str, list[float]]] = {}
    step_s: dict[str, list[float]] = {}
    ratio: dict[str, dict[str, list[float]]] = {}
    for run in children:
        loss = run.data.params.get("trainer/loss", "?")
        for m in client.get_metric_history(run.info.run_id, "eval/reward"):
            evals.setdefault(loss, {}).setdefault(m.step, []).append(m.value)
        for key in ("eval/reward_1h", "eval/reward_2h", "eval/reward_4h", "eval_greedy/reward"):
            last.setdefault(loss, {}).setdefault(key, []).append(run.data.metrics.get(key, float("nan")))
        steps = [m.value for m in client.get_metric_history(run.info.run_id, "time/step_s") if m.step >= 1]
        step_s.setdefault(loss, []).append(sum(steps) / len(steps) if steps else float("nan"))
        for key in RATIO_METRICS:  # the run's mean over its steps: how often the clip bound, how far the ratio moved
            hist = [m.value for m in client.get_metric_history(run.info.run_id, key)]
            ratio.setdefault(loss, {}).setdefault(key, []).append(sum(hist) / len(hist) if hist else float("nan"))
    at = sorted({s for by in evals.values() for s in by})
    cell = "{:.3f} ± {:.3f}".format
    lines = [f"\n## (2) losses x seeds: parent run {parent.info.run_id}, {len(children)} children, "
             f"{wall / 60:.1f} min\n",
             "| loss | seeds | " + " | ".join(f"eval@{s}" for s in at) +
             " | last eval 1h / 2h / 4h | greedy-decoded (end) | clip fraction | approx KL | s/step |",
             "|---|---|" + "---|" * (len(at) + 5)]
    for loss, by in sorted(evals.items()):
        cells = [(cell(*mean_se(by[s])) if s in by else "-") for s in at]
        hours = " / ".join(f"{mean_se(last[loss][f'eval/reward_{h}h'])[0]:.3f}" for h in (1, 2, 4))
        lines.append(f"| {loss} | {len(step_s[loss])} | " + " | ".join(cells) +
                     f" | {hours} | {cell(*mean_se(last[loss]['eval_greedy/reward']))} | "
                     f"{'{:.4f} ± {:.4f}'.format(*mean_se(ratio[loss]['train/clip_fraction']))} | "
                     f"{'{:.5f} ± {:.5f}'.format(*mean_se(ratio[loss]['train/approx_kl']))} | "
                     f"{cell(*mean_se(step_s[loss]))} |")
    return "\n".join(lines)


def flagship(args: argparse.Namespace, extra: list[str]) -> None:
    """(3) `python -m agentrl +recipe=gridsim_grpo` in a fresh home, all in."""
    home = Path(args.home)
    wall = cli(home, ["+recipe=gridsim_grpo", *extra], home / "flagship.log", threads=0)
    tail = (home / "flagship.log").read_text().splitlines()[-6:]
    print(f"\n## (3) the flagship: {wall / 60:.1f} min all in\n" + "\n".join(tail))


def temps(args: argparse.Namespace, extra: list[str]) -> None:
    """(3)'s eval-temperature lever: one model (the flagship's warm start by default) on the eval days, sampled
    at each `--temps` and greedy-decoded, by battery duration."""
    home = Path(args.home)
    model = args.model or str(start_path(home, extra, recipe="gridsim_grpo"))
    cfg = compose_config(*["+recipe=gridsim_grpo", *extra])
    plan = plan_for(cfg, home / "run-temps")
    print(f"\n## {model}, {cfg.trainer.eval_limit or 'all'} eval days\n")
    print("| decoding | 1h | 2h | 4h | all |\n|---|---|---|---|---|")
    for i, temp in enumerate(args.temps):
        last = i == len(args.temps) - 1  # the greedy-decoded eval once, with the last temperature's
        m, _ = eval_both(cfg, plan, model, cfg.trainer.eval_limit, temp, greedy_too=last)
        for name, prefix in [(f"sampled T={temp}", "eval")] + [("greedy-decoded", "eval_greedy")] * last:
            print(row(name, m, prefix), flush=True)


def curve(args: argparse.Namespace, extra: list[str]) -> None:
    """`beat`'s runs (`--tag`) as eval reward against wall minutes since each run started (MLflow's own
    timestamps of `eval/reward` and `eval_greedy/reward`), the greedy rule as a line: a PNG at `--out`, and the
    points as a table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlflow.tracking import MlflowClient

    home = Path(args.home)
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    folder = str(home / f"beat{args.tag}")
    runs = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
            if r.data.tags.get("agentrl.run_dir", "").startswith(folder + "/seed-")]
    if not runs:
        raise SystemExit(f"no runs under {folder} in {home / 'mlflow.db'}")
    cfg = compose_config(*[f"+recipe={RECIPE}", *extra])
    rule = greedy_rule_scores(plan_for(cfg, home / "run-eval"), cfg.trainer.eval_limit)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    print("| seed | metric | step | wall min | eval reward |\n|---|---|---|---|---|")
    for run in sorted(runs, key=lambda r: r.data.tags["agentrl.run_dir"]):
        seed = run.data.tags["agentrl.run_dir"].rsplit("seed-", 1)[1]
        for key, style in (("eval/reward", "-o"), ("eval_greedy/reward", "--x")):
            points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
            minutes = [(m.timestamp - run.info.start_time) / 60000 for m in points]
            ax.plot(minutes, [m.value for m in points], style, markersize=3,
                    label=f"seed {seed} {'sampled' if key == 'eval/reward' else 'greedy-decoded'}")
            for m, t in zip(points, minutes, strict=True):
                print(f"| {seed} | {key} | {m.step} | {t:.1f} | {m.value:.3f} |")
    ax.axhline(sum(rule) / len(rule), color="k", lw=1, ls=":", label=f"greedy rule {sum(rule) / len(rule):.3f}")
    ax.set_xlabel("wall minutes since the run started (warm start reused)")
    ax.set_ylabel(f"eval reward, {len(rule)} eval days")
    # long override lists ran off the figure's edge: wrap them
    title = f"GRPO from the greedy rule's imitation ({' '.join(extra) or 'recipe defaults'})"
    ax.set_title("\n".join(textwrap.wrap(title, 110)), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"\nwrote {args.out}")


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("proof", choices=("start", "beat", "compare", "flagship", "temps", "curve"))
    ap.add_argument("--home", required=True, help="output root: the start, the runs, the MLflow store")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--losses", default="grpo,dr_grpo,dapo,gspo")
    ap.add_argument("--jobs", type=int, default=1, help="beat: seeds run at once (one torch thread each)")
    ap.add_argument("--cli-eval-limit", type=int, default=None,
                    help="beat: eval days of the GRPO runs' own evals (default: the recipe's; the benchmark's "
                         "paired table always plays the recipe's eval days)")
    ap.add_argument("--reuse", action="store_true",
                    help="beat: a seed whose run folder already holds final_model is evaluated, not trained again")
    ap.add_argument("--start", help="beat: the folder every run starts from (default: the recipe's warm start "
                                    "under these overrides, made if missing)")
    ap.add_argument("--tag", default="", help="suffix for the run folders (several measurements in one home)")
    ap.add_argument("--temps", type=float, nargs="+", default=[1.1, 0.8, 0.6],
                    help="temps: sampling temperatures to evaluate at")
    ap.add_argument("--model", help="temps: the model folder (default: the flagship's warm start, made if missing)")
    ap.add_argument("--parent", help="compare: only print the table of this MLflow sweep parent's children")
    ap.add_argument("--out", default="curve.png", help="curve: the PNG written")
    args = ap.parse_args(argv)
    print(f"# algorithms benchmark {time.strftime('%Y-%m-%d %H:%M')} load {os.getloadavg()[0]:.1f} "
          f"({args.proof}, overrides {extra})", flush=True)
    if args.proof == "start":
        print(start_path(Path(args.home), extra))
    else:
        {"beat": beat, "compare": compare, "flagship": flagship, "temps": temps, "curve": curve}[args.proof](args, extra)


if __name__ == "__main__":
    main()
