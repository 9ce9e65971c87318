"""Does training work? (1) SFT on optimal demonstrations, evaluated on the eval days; (2) SFT on the greedy
rule's demonstrations, then GRPO with the grader's reward: eval must rise above the SFT start by more than
twice the standard error of the paired per-day difference.

    python benchmarks/studies/learning.py                       # the full measurement (CPU, one thread)
    python benchmarks/studies/learning.py --sft-steps 50 --grpo-steps 2 --eval-limit 20   # a quick look

Prints one table per part and the GRPO step's time split (generate, env, train, weight push, other).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from agentrl.paired import paired_diff
from agentrl.testing.config import compose_config


def plan_for(cfg, run_dir: Path):
    from agentrl.plan import build_plan

    return build_plan(cfg, choices={}, run_dir=run_dir)


def eval_both(cfg, plan, model_path: str, limit: int | None, temperature: float, greedy_too: bool = True):
    """Sampled at `temperature` (eval/*) and, with `greedy_too`, greedy-decoded (eval_greedy/*); and the sampled
    per-task rewards."""
    from agentrl.play.evaluate import evaluate
    from agentrl.play.services import start_services

    svc = start_services(plan, model_path)
    greedy: dict[str, float] = {}
    try:
        sampled, played_s = evaluate(svc, plan.bundle, cfg.env.eval_split, limit=limit,
                                     sampling=plan.sampling.at(temperature), seed_parts=(cfg.seed, "bench"))
        if greedy_too:
            greedy, _ = evaluate(svc, plan.bundle, cfg.env.eval_split, limit=limit,
                                 sampling=plan.sampling.greedy_copy(), prefix="eval_greedy")
    finally:
        svc.close()
    return sampled | greedy, [p.score for p in played_s]


def baselines(plan, limit: int | None) -> dict[str, dict[str, float]]:
    from agentrl.envs.bundles.gridsim.baselines import baseline_table

    rows = plan.bundle.rows(plan.settings.env.eval_split)
    return baseline_table(rows[:limit] if limit else rows)


def row(name: str, m: dict[str, float], prefix: str) -> str:
    cells = [m.get(f"{prefix}/reward_{d}h", float("nan")) for d in (1, 2, 4)] + [m.get(f"{prefix}/reward", 0.0)]
    return f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-steps", type=int, default=1500)
    ap.add_argument("--augment", type=int, default=None, help="SFT variants per train day (default: the recipe's)")
    ap.add_argument("--sft-weight-decay", type=float, default=None, help="SFT weight decay (default: the recipe's)")
    ap.add_argument("--grpo-steps", type=int, default=300)
    ap.add_argument("--grpo-lr", type=float, default=None, help="GRPO learning rate (default: the recipe's)")
    ap.add_argument("--eval-limit", type=int, default=None, help="eval days (default: all 200)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="", help="suffix for part 2's run folders (several GRPO runs in one home)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--home", default=None, help="output root (default: a temporary folder)")
    ap.add_argument("--part", choices=("1", "2", "all"), default="all",
                    help="run part 1 or 2 alone (e.g. one process per core)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    home = Path(args.home or tempfile.mkdtemp(prefix="agentrl-learning-"))
    import os

    os.environ["AGENTRL_HOME"] = str(home)
    limit = args.eval_limit
    common = [f"seed={args.seed}", "env.prompt_style=compact", "agent.max_response_tokens=96"]
    print(f"# learning benchmark {time.strftime('%Y-%m-%d')} (torch threads {args.threads}, home {home})")

    if args.part in ("1", "all"):
        part_one(args, home, common, limit)
    if args.part in ("2", "all"):
        part_two(args, home, common, limit)


def sft_overrides(args: argparse.Namespace, node: str) -> list[str]:
    """The SFT flags given on the command line, as overrides of `node` (trainer or trainer.warm_start)."""
    given = {"augment": args.augment, "weight_decay": args.sft_weight_decay}
    return [f"{node}.{k}={v}" for k, v in given.items() if v is not None]


def part_one(args: argparse.Namespace, home: Path, common: list[str], limit: int | None) -> None:
    """(1) SFT on optimal demonstrations, beside the idle and greedy rules."""
    from agentrl.trainers.sft.trainer import run_sft, sft_checkpoint_path

    cfg = compose_config("+recipe=gridsim_sft", f"trainer.steps={args.sft_steps}", *common,
                         *sft_overrides(args, "trainer"))
    plan = plan_for(cfg, home / "run-sft")
    out = sft_checkpoint_path(plan.settings, plan.settings.trainer, plan.bundle, plan.agent)
    t0 = time.monotonic()
    done = (out / "config.json").is_file()
    sft = {"sft/loss": float("nan")} if done else run_sft(plan, out, plan.settings.trainer)
    sft_s = time.monotonic() - t0
    m1, _ = eval_both(cfg, plan, str(out), limit, 1.1)
    base = baselines(plan, limit)
    print(f"\n## (1) SFT on optimal demonstrations: {args.sft_steps} steps in {sft_s / 60:.1f} min "
          f"(final loss {sft['sft/loss']:.4f}), eval on {limit or 200} days\n")
    print("| policy | 1h | 2h | 4h | all |\n|---|---|---|---|---|")
    for pol in ("idle", "greedy"):
        print(f"| {pol} rule | " + " | ".join(f"{base.get(g, {}).get(pol, float('nan')):.3f}" for g in ("1h", "2h", "4h", "all")) + " |")
    print(row("SFT, sampled T=1.1", m1, "eval"))
    print(row("SFT, greedy-decoded", m1, "eval_greedy"))



def part_two(args: argparse.Namespace, home: Path, common: list[str], limit: int | None) -> None:
    """(2) SFT on the greedy rule's demonstrations, then GRPO with the grader's reward."""
    from agentrl.tracking.mlflow_tracker import MLflowTracker

    # The flagship's settings this part was measured with (before its warm start on generated days at T=0.6):
    # sampled at T=1.1, the warm start on the stored days with 7 other batteries each.
    former = ["trainer.temperature=1.1", "trainer.warm_start.generated=0",
              *(["trainer.warm_start.augment=7"] if args.augment is None else [])]
    cfg2 = compose_config("+recipe=gridsim_grpo", f"trainer.steps={args.grpo_steps}",
                          "trainer.warm_start.teacher=greedy", f"trainer.warm_start.steps={args.sft_steps}",
                          f"trainer.eval_limit={limit or 200}", *former, *sft_overrides(args, "trainer.warm_start"),
                          "trainer.eval_every=0", "trainer.checkpoint_every=0", *common,
                          *([f"trainer.lr={args.grpo_lr}"] if args.grpo_lr else []))
    plan2 = plan_for(cfg2, home / f"run-grpo{args.tag}")
    from agentrl.trainers.grpo.trainer import GRPOTrainer
    from agentrl.trainers.sft.warm_start import warm_start_path

    # A real MLflow run in the benchmark's own store (browse it with `mlflow ui`); the step split is read back from it.
    tracker = MLflowTracker(tracking_uri=f"sqlite:///{home / 'mlflow.db'}", experiment="benchmark-learning",
                            output_root=home)
    tracker.start(cfg2, choices={}, run_dir=plan2.run_dir)
    trainer = GRPOTrainer(plan=plan2, tracker=tracker)
    t0 = time.monotonic()
    try:
        trainer.fit()
    finally:
        tracker.finish()
    grpo_s = time.monotonic() - t0
    start_path = warm_start_path(plan2)  # the SFT(greedy) folder, already made
    m_start, r_start = eval_both(cfg2, plan2, start_path, limit, 1.1)
    final_path = home / f"grpo-final{args.tag}"
    trainer.learner.model.save_pretrained(final_path)
    trainer.tokenizer.save_pretrained(final_path)
    m_end, r_end = eval_both(cfg2, plan2, str(final_path), limit, 1.1)
    paired = paired_diff(r_end, r_start)
    mean, se = paired.mean, paired.se
    print(f"\n## (2) SFT on greedy-rule demonstrations, then {args.grpo_steps} GRPO steps ({grpo_s / 60:.1f} min)\n")
    print("| model | 1h | 2h | 4h | all |\n|---|---|---|---|---|")
    print(row("SFT(greedy), sampled", m_start, "eval"))
    print(row("SFT(greedy)+GRPO, sampled", m_end, "eval"))
    print(row("SFT(greedy), greedy-decoded", m_start, "eval_greedy"))
    print(row("SFT(greedy)+GRPO, greedy-decoded", m_end, "eval_greedy"))
    verdict = "PASS" if mean > 2 * se else "FAIL"
    print(f"\npaired per-day difference (sampled): {mean:+.4f} +- {se:.4f} (se); rise > 2 se: {verdict}")

    split_keys = ("time/step_s", "time/generate_s", "time/train_s", "time/weight_push_s", "time/eval_s")
    by_step: dict[int, dict[str, float]] = {}
    for key in split_keys:
        for m in tracker.client.get_metric_history(tracker.run_id, key):
            by_step.setdefault(m.step, {})[key] = m.value
    steps = [m for s, m in sorted(by_step.items()) if s >= 1 and "time/step_s" in m]
    if steps:
        tot = {k: sum(m.get(k, 0.0) for m in steps) for k in split_keys}
        other = tot["time/step_s"] - tot["time/generate_s"] - tot["time/train_s"] - tot["time/weight_push_s"]
        print(f"\nstep time split over {len(steps)} steps (s/step): generate+env {tot['time/generate_s'] / len(steps):.2f}, "
              f"train {tot['time/train_s'] / len(steps):.2f}, weight push {tot['time/weight_push_s'] / len(steps):.3f}, "
              f"other {other / len(steps):.3f}; eval {tot['time/eval_s'] / max(len(steps), 1):.2f} s/step averaged")


if __name__ == "__main__":
    main()
