"""Does each agent pattern learn, and does co-evolution pay? One command per measurement (issue 17).

    python benchmarks/studies/patterns.py pattern --recipe arith_co_evolution --steps 20       # a pattern's run
    python benchmarks/studies/patterns.py pattern --agent thinker_verifier --steps 20 env=arith reward=env_score \\
        agent.accept=agreement agent.max_turns=2 $ARITH_WARM_START   # arith_co_evolution's warm start
    python benchmarks/studies/patterns.py compare --recipe gridsim_co_evolution --steps 20     # vs a single agent
    python benchmarks/studies/patterns.py roles --recipe arith_co_evolution --steps 5          # models per role

`pattern`: train with GRPO from the recipe's warm start; eval the start and the result on the same tasks and
seeds (paired per-task difference +- se); the multi-agent metrics of the last step and the health line.
`compare`: the same co-evolution run, then a single tool_calling agent from the same warm start trained until it
has generated as many model tokens (equal compute); per eval task, co-evolution's selected answer vs its solvers'
mean vs the single agent (paired differences +- se). `roles`: a frozen selector on its own model folder (its
hash before and after) and a rewriter training its own model (its own optimizer). Each prints markdown and
writes a JSON next to it (--out). Extra arguments are Hydra overrides. Warm starts are cached under --home.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from learning import plan_for  # noqa: E402 - the sibling benchmark's config helpers

from agentrl.paired import mean_se as paired_mean_se  # noqa: E402
from agentrl.paired import paired_diff  # noqa: E402
from agentrl.testing.config import compose_config  # noqa: E402

MA_KEYS = ("multi_agent/avg_turns", "multi_agent/early_termination_rate", "multi_agent/conversation_token_count",
           "loss_mask/role_split")


class Memory:
    """A tracker that keeps every logged metric in memory (the benchmark reads them back)."""

    run_id = "bench"

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.steps.setdefault(step, {}).update(metrics)

    def log_artifact(self, *a: Any, **k: Any) -> None: ...

    def set_tags(self, *a: Any, **k: Any) -> None: ...

    def log_model(self, *a: Any, **k: Any) -> None: ...


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean and standard error of the per-task difference b - a (`agentrl.paired.paired_diff`)."""
    d = paired_diff(b, a)
    return d.mean, d.se


def mean_se(xs: list[float]) -> str:
    m, se = paired_mean_se(xs)
    return f"{m:.3f} ± {se:.3f}"


def play_eval(cfg: Any, plan: Any, model_path: str, limit: int, seed: str) -> list[list[Any]]:
    """Every eval task played once by the run's agent on `model_path` (training temperature, fixed seeds)."""
    import asyncio

    from agentrl.play.evaluate import eval_indices
    from agentrl.play.rollout import make_row
    from agentrl.play.services import start_services

    svc = start_services(plan, model_path, _role_policies(cfg))
    try:
        rows = [make_row(plan.bundle, cfg.env.eval_split, i, svc.env_url, svc.env_settings)
                for i in eval_indices(plan.bundle, cfg.env.eval_split, limit)]
        kwargs = {"temperature": float(cfg.trainer.temperature), "top_p": 1.0,
                  "chat_template_kwargs": {"enable_thinking": False}}
        groups: list[list[Any]] = []
        for start in range(0, len(rows), 32):
            groups += asyncio.run(svc.runner.play_rows(rows[start:start + 32], 1, request_kwargs=kwargs,
                                                       seed_parts=(cfg.seed, seed)))
        return groups
    finally:
        svc.close()


def _role_policies(cfg: Any) -> list[Any]:
    from agentrl.play.policies import plan_policies
    from agentrl.trainers.grpo.policy_steps import load_learners

    policies = plan_policies(cfg.agent.get("roles"))
    for p in policies:
        p.trainable = False  # eval only: an engine per role model, no learner
    load_learners(cfg.trainer, policies, model_cfg=cfg.model)
    return policies


def outcome_rewards(groups: list[list[Any]]) -> list[float]:
    from agentrl.play.evaluate import outcome_of

    return [outcome_of(g).score for g in groups]


def role_mean(groups: list[list[Any]], role: str) -> list[float]:
    """Per task, the mean score of the role's rollouts (unweighted; 0 when the play never reached it)."""
    out = []
    for g in groups:
        rs = [r.score for r in g if r.role == role]
        out.append(sum(rs) / len(rs) if rs else 0.0)
    return out


def ended_early(groups: list[list[Any]]) -> float:
    """Share of plays that ended before their outcome (an early exit or a flag in any rollout): a verifier that
    never accepted, an invalid variant, a play without a selected answer."""
    return sum(any(r.early_exit or r.failure for r in g) for g in groups) / max(len(groups), 1)


def train(cfg: Any, plan: Any, *, token_budget: float | None = None, seconds_budget: float | None = None
          ) -> tuple[Any, Memory, float, str]:
    """GRPO for trainer.steps (or until `token_budget` model tokens were generated, or `seconds_budget` seconds
    of train steps passed); returns (trainer, tracker, train seconds, folder of the final shared model)."""
    from agentrl.trainers.grpo.trainer import GRPOTrainer

    tracker = Memory()
    trainer = GRPOTrainer(plan=plan, tracker=tracker)
    t0 = time.monotonic()
    if token_budget is None and seconds_budget is None:
        trainer.fit()
    else:  # equal compute: step until the rollouts generated as many model tokens (or ran as long)
        trainer.setup(plan)
        try:
            step, used, began = 0, 0.0, time.monotonic()
            while (used < token_budget) if token_budget is not None else \
                    (time.monotonic() - began < seconds_budget):
                step += 1
                metrics = trainer.train_step(step).as_metrics()
                used += metrics["rollout/model_tokens"]
                tracker.log(metrics, step=step)
                trainer.health.add(metrics)
            print(f"equal compute: {step} steps, {used:.0f} model tokens, {time.monotonic() - began:.0f} s "
                  f"(budget {token_budget or seconds_budget:.0f} {'tokens' if token_budget else 's'})", flush=True)
            print(trainer.health.summary(), flush=True)
        finally:
            trainer.cleanup()
    seconds = time.monotonic() - t0
    folder = Path(plan.run_dir) / "final_model"
    trainer.learner.model.save_pretrained(folder)
    trainer.tokenizer.save_pretrained(folder)
    return trainer, tracker, seconds, str(folder)


def last_metrics(tracker: Memory) -> dict[str, float]:
    steps = [s for s in sorted(tracker.steps) if s > 0 and "train/reward" in tracker.steps[s]]
    return tracker.steps[steps[-1]] if steps else {}


def tokens_used(tracker: Memory) -> float:
    return sum(m.get("rollout/model_tokens", 0.0) for s, m in tracker.steps.items() if s > 0)


def setup(args: argparse.Namespace, extra: list[str], name: str) -> tuple[Any, Any]:
    overrides = [*([f"+recipe={args.recipe}"] if args.recipe else []), f"trainer.steps={args.steps}", f"trainer.eval_limit={args.fit_eval_limit}",
                 "trainer.eval_every=0", "trainer.checkpoint_every=0", f"seed={args.seed}", *extra]
    if args.agent:
        overrides.insert(1, f"agent={args.agent}")
    cfg = compose_config(*overrides)
    return cfg, plan_for(cfg, Path(args.home) / f"run-{name}")


def cmd_pattern(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    from agentrl.trainers.sft.warm_start import warm_start_path

    cfg, plan = setup(args, extra, f"pattern-{args.agent or args.recipe}")
    start = warm_start_path(plan)
    # --token-budget: train until the rollouts generated that many model tokens (another run's, equal compute)
    trainer, tracker, seconds, final = train(cfg, plan, token_budget=args.token_budget or None)
    before = play_eval(cfg, plan, start, args.eval_limit, "bench")
    after = play_eval(cfg, plan, final, args.eval_limit, "bench")
    b, a = outcome_rewards(before), outcome_rewards(after)
    diff, se = paired(b, a)
    end = last_metrics(tracker)
    ma = ", ".join(f"{k.split('/')[-1]} {end[k]:.2f}" for k in MA_KEYS if k in end)
    roles = sorted({r.role for g in after for r in g})
    by_role = {role: (sum(role_mean(before, role)) / len(before), sum(role_mean(after, role)) / len(after))
               for role in roles}
    early = (ended_early(before), ended_early(after))
    result = {"pattern": type(plan.agent).__name__, "task": cfg.env.bundle, "start": mean_se(b), "after": mean_se(a),
              "steps": max([s for s in tracker.steps if s > 0], default=0), "train_s": seconds, "paired_diff": diff, "paired_se": se,
              "multi_agent_end": {k: v for k, v in end.items() if k.startswith(("multi_agent/", "loss_mask/"))},
              "by_role_before_after": by_role, "health": trainer.health.summary(), "eval_tasks": len(b),
              "eval_ended_early_before_after": early, "model_tokens": tokens_used(tracker),
              "start_rewards": b, "after_rewards": a}
    print(f"| {result['pattern']} | {result['task']} | {result['start']} | {result['after']} (N={result['steps']}) "
          f"| {seconds / 60:.1f} min | {ma} |")
    print(f"paired after - start: {diff:+.3f} ± {se:.3f} (se) over {len(b)} eval tasks; by role {by_role}; "
          f"eval plays ended early {early[0]:.2f} -> {early[1]:.2f}; {tokens_used(tracker):.0f} model tokens in training")
    print(result["health"])
    return result


def cmd_compare(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    from agentrl.trainers.sft.warm_start import warm_start_path

    cfg, plan = setup(args, extra, "compare-co")
    start = warm_start_path(plan)
    if args.co_final:  # a co-evolution model trained before (e.g. by a run whose single agent failed): equal time
        co_s, co_final, budget = float(args.co_seconds), args.co_final, None
    else:
        _, tracker, co_s, co_final = train(cfg, plan)
        budget = tokens_used(tracker)
        Path(args.home, "compare-co.json").write_text(json.dumps({"final": co_final, "seconds": co_s,
                                                                   "tokens": budget}))
    # The single agent: the flagship's recipe and settings from the same warm start, sampled (and evaluated) at
    # the co-evolution run's temperature (the flagship's own is 0.6, co-evolution's 1.1).
    single = argparse.Namespace(**{**vars(args), "recipe": args.single_recipe, "agent": None})
    single_over = [o for o in extra if not o.startswith(("agent.", "trainer.warm_start"))] + \
        [f"trainer.warm_start.checkpoint={start}", f"trainer.temperature={cfg.trainer.temperature}"]
    cfg1, plan1 = setup(single, single_over, "compare-single")
    _, tracker1, one_s, one_final = train(cfg1, plan1, token_budget=budget,
                                          seconds_budget=co_s if budget is None else None)
    budget = budget if budget is not None else tokens_used(tracker1)
    co_start = play_eval(cfg, plan, start, args.eval_limit, "bench")
    co = play_eval(cfg, plan, co_final, args.eval_limit, "bench")
    single = play_eval(cfg1, plan1, one_final, args.eval_limit, "bench")
    single_start = play_eval(cfg1, plan1, start, args.eval_limit, "bench")
    sel, sel0 = outcome_rewards(co), outcome_rewards(co_start)
    solvers, one, one0 = role_mean(co, "solver"), outcome_rewards(single), outcome_rewards(single_start)
    rows = {"co-evolution selected (start)": sel0, "co-evolution selected (after)": sel,
            "co-evolution solvers' mean (after)": solvers, "single agent (start)": one0,
            "co-evolution solvers' mean (start)": role_mean(co_start, "solver"),
            f"single agent (after, equal {'wall time' if args.co_final else 'model tokens'})": one}
    print(f"\n## compare on {len(sel)} eval tasks: co-evolution {co_s / 60:.1f} min, single agent "
          f"{one_s / 60:.1f} min ({tokens_used(tracker1):.0f} model tokens)\n\n"
          "| policy | eval reward (mean ± se) |\n|---|---|")
    for name, xs in rows.items():
        print(f"| {name} | {mean_se(xs)} |")
    pairs = {"selected - solvers' mean": paired(solvers, sel), "selected - single agent": paired(one, sel),
             "selected after - start": paired(sel0, sel), "single after - start": paired(one0, one)}
    for name, (m, se) in pairs.items():
        print(f"paired {name}: {m:+.3f} ± {se:.3f} (se){'  > 2 se' if m > 2 * se else ''}")
    return {"rows": {k: mean_se(v) for k, v in rows.items()}, "pairs": pairs, "co_s": co_s, "single_s": one_s,
            "tokens": budget, "tokens_single": tokens_used(tracker1)}


def digest(folder: str) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cmd_roles(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    from agentrl.play.policies import MAIN
    from agentrl.trainers.sft.warm_start import warm_start_path

    cfg0, plan0 = setup(args, extra, "roles-warm")
    start = warm_start_path(plan0)
    home = Path(args.home)
    selector, rewriter = home / "role-selector", home / "role-rewriter"
    for folder in (selector, rewriter):  # each role model starts as a copy of the warm start
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(start, folder)
    out: dict[str, Any] = {}
    runs = {"frozen selector": [f"agent.roles.2.model={selector}", "agent.roles.2.frozen=true"],
            "own rewriter model + frozen selector": [f"agent.roles.1.model={rewriter}",
                                                     f"agent.roles.2.model={selector}", "agent.roles.2.frozen=true"]}
    for name, over in runs.items():
        before = {"selector": digest(str(selector)), "rewriter": digest(str(rewriter))}
        cfg, plan = setup(args, [*extra, *over], "roles-" + name.split()[0])
        trainer, tracker, seconds, _ = train(cfg, plan)
        after_live = {p.name: p for p in trainer.policies}
        rewriter_changed = None
        if "rewriter" in after_live and after_live["rewriter"].learner is not None:
            saved = home / "role-rewriter-trained"
            after_live["rewriter"].learner.model.save_pretrained(saved)
            rewriter_changed = digest(str(saved)) != before["rewriter"]
        end = last_metrics(tracker)
        learners = sorted(p.name for p in trainer.policies if p.learner is not None)
        optimizers = len({id(p.learner.optimizer) for p in trainer.policies if p.learner is not None})
        final_eval = {k: v for k, v in tracker.steps.get(int(cfg.trainer.steps), {}).items()
                      if k.startswith("eval/reward")}
        start_eval = {k: v for k, v in tracker.steps.get(0, {}).items() if k.startswith("eval/reward")}
        out[name] = {"selector_hash_before": before["selector"], "selector_hash_after": digest(str(selector)),
                     "trained_policies": learners, "optimizers": optimizers, "rewriter_model_changed": rewriter_changed,
                     "train_metrics": {k: v for k, v in end.items() if k.startswith("train/") and "loss" in k},
                     "eval_start": start_eval, "eval_end": final_eval, "train_s": seconds}
        unchanged = before["selector"] == out[name]["selector_hash_after"]
        print(f"\n## {name}: trained {learners} ({optimizers} optimizers), {seconds / 60:.1f} min; frozen selector "
              f"hash {before['selector']} -> {out[name]['selector_hash_after']} (unchanged: {unchanged}); "
              f"rewriter model changed: {rewriter_changed}")
        print(f"eval start {start_eval}\neval end {final_eval}")
        assert MAIN in learners
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("pattern", "compare", "roles"))
    ap.add_argument("--recipe", default="", help="a recipe; none: the overrides say everything")
    ap.add_argument("--agent", default=None, help="the agent pattern (agent=...)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-limit", type=int, default=100)
    ap.add_argument("--single-recipe", default="gridsim_grpo", help="compare: the single agent's recipe")
    ap.add_argument("--co-final", default=None, help="compare: a trained co-evolution model (skip its training)")
    ap.add_argument("--co-seconds", type=float, default=0.0, help="compare: its train seconds (equal wall time)")
    ap.add_argument("--token-budget", type=float, default=0.0,
                    help="pattern: train until this many model tokens were generated instead of --steps")
    ap.add_argument("--fit-eval-limit", type=int, default=20, help="tasks of the run's own evals (its curve)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--home", default="/tmp/agentrl-patterns", help="output root (warm starts cached here)")
    ap.add_argument("--out", default=None, help="JSON results file")
    args, extra = ap.parse_known_args()
    os.environ["AGENTRL_HOME"] = args.home
    import torch

    torch.set_num_threads(args.threads)
    print(f"# patterns {args.command} {time.strftime('%Y-%m-%d %H:%M')} recipe {args.recipe} agent {args.agent} "
          f"steps {args.steps} eval {args.eval_limit} overrides {extra} (load {os.getloadavg()[0]:.1f})", flush=True)
    result = {"pattern": cmd_pattern, "compare": cmd_compare, "roles": cmd_roles}[args.command](args, extra)
    print(f"(load at the end {os.getloadavg()[0]:.1f})")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
