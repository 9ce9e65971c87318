"""Issue 33, proof 3: can co-evolution's selector learn to pick the best of the solvers' schedules?

    python benchmarks/studies/learned_selector.py --home H --solver FLAGSHIP_WARM_START --days 6000 \
        --steps 800 --lr 1e-3 --baseline 'benchmarks/data/issue33/p3-one-agent-maj9-seed*.jsonl.gz'

Co-evolution beats one agent only if a later role adds what the solvers' samples lack; at equal model tokens one
agent's majority vote over 9 samples (maj@9) already scores 0.963, and the best of 4 samples 0.981. So the question
is whether a selector can learn to find the best of 4 real candidates. This script:
1. plays `--days` generated train days `--samples` times with the solver model (`gridsim_grpo`, T=`--temperature`);
2. fine-tunes a selector from the solver's weights on co-evolution's selector prompt (`agent.selection=judgment`)
   showing those candidates (`--perms` shuffles a day), answering `Judgment: i` with the best-graded one;
3. on each eval day of the `--baseline` files (one agent's per-task evals, several samples a day), shows the
   selector the first `--samples` samples, picks the `Judgment: k` it finds likeliest, and prints, per eval seed
   and paired per day over the seeds: the pick against maj@n (all samples), against a random pick (their mean),
   and the per-hour vote over the same candidates (an aggregate no role has to learn).
The selector never sees grades: with them it would be best-of-n with the env's grader (the recipe's comment).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import statistics as st
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import plan_for  # noqa: E402 - the sibling benchmark's helper

from agentrl.testing.config import compose_config  # noqa: E402


def best_index(scores: list[float]) -> int:
    """The first best-graded candidate's index (what the selector is taught to answer)."""
    return max(range(len(scores)), key=lambda i: scores[i])


def per_hour_vote(schedules: list[list[int]], duration: int) -> list[int]:
    """Each hour's most common action over `schedules` (a tie goes to the action given first), walked so the
    storage stays in [0, duration] (a vote that would leave it is idle): always a feasible schedule."""
    soc, out = 0, []
    for hour in zip(*schedules, strict=True):
        action = Counter(hour).most_common(1)[0][0]
        if not 0 <= soc + action <= duration:
            action = 0
        out.append(action)
        soc += action
    return out


def _schedule(answer: str) -> list[int] | None:
    try:
        value = json.loads(answer.split(" ", 1)[1])["schedule"]
    except (IndexError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, list) and len(value) == 24 else None


def play_candidates(plan: Any, solver: str, days: int, samples: int, temperature: float, seed: int,
                    path: Path) -> list[dict[str, Any]]:
    """Each generated day's prompts and its `samples` candidates (answer, grade), played once and kept in `path`."""
    if not path.exists():
        from agentrl.agents.base import task_prompts
        from agentrl.play.evaluate import outcome_of, play_tasks
        from agentrl.play.rollout import make_row
        from agentrl.play.services import start_services

        started = time.monotonic()
        svc = start_services(plan, solver)
        try:
            rows = [make_row(plan.bundle, "generated", i, svc.env_url, svc.env_settings) for i in range(days)]
            per_row = play_tasks(svc, rows, samples=samples, sampling=plan.sampling.at(temperature),
                                 seed_parts=(seed, "learned-selector"))
        finally:
            svc.close()
        with path.open("w") as f:
            for row, plays in zip(rows, per_row, strict=True):
                system, task = task_prompts(row)
                outs = [outcome_of(p) for p in plays]
                cands = [[o.answer if o.failure is None else "", o.score] for o in outs]
                f.write(json.dumps({"system": system, "task": task, "candidates": cands}) + "\n")
        print(f"played {days} days x {samples} in {time.monotonic() - started:.0f} s", flush=True)
    return [json.loads(line) for line in path.open()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--solver", required=True, help="the solvers' model folder (the flagship's warm start)")
    ap.add_argument("--baseline", required=True, help="glob of one agent's per-task eval files, one per eval seed")
    ap.add_argument("--days", type=int, default=6000, help="generated train days played for the selector's data")
    ap.add_argument("--samples", type=int, default=4, help="candidates a day (co-evolution's num_parallel)")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--perms", type=int, default=2, help="shuffled copies of each day's candidates")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    home = Path(args.home)
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AGENTRL_HOME"] = str(home)
    import torch
    from transformers import AutoTokenizer

    from agentrl.agents.demos import assistant
    from agentrl.devices import set_threads
    from agentrl.envs.bundles.gridsim.battery import profit_units, score
    from agentrl.envs.bundles.gridsim.episode import parse_day
    from agentrl.envs.task import opening_turn
    from agentrl.play.eval_results import majority_score
    from agentrl.trainers.common.trained_model import load_trained_model
    from agentrl.trainers.sft.demonstrations import encode_chat
    from agentrl.trainers.sft.trainer import save_hf_folder, train_sft

    plan = plan_for(compose_config("+recipe=gridsim_grpo", f"seed={args.seed}", f"env.generated_days={args.days}",
                                   "env.train_split=generated"), home / "run")
    set_threads(plan.settings)
    days = play_candidates(plan, args.solver, args.days, args.samples, args.temperature, args.seed,
                           home / f"candidates-{args.days}x{args.samples}-t{args.temperature}-s{args.seed}.jsonl")
    agent = plan_for(compose_config("+recipe=gridsim_co_evolution", "agent.selection=judgment"), home / "co").agent
    tokenizer = AutoTokenizer.from_pretrained(args.solver)

    def chat(system: str, task: str, answers: list[str], pick: int) -> tuple[list[int], list[int]]:
        messages = agent.role_messages("selector", system, task, answers)
        return encode_chat(tokenizer, ([*messages, assistant(f"Judgment: {pick}")], None), "selector")

    rng = random.Random(args.seed)
    data = []
    for day in days:
        cands = [(a, s) for a, s in day["candidates"] if a.strip()]
        for _ in range(args.perms if len(cands) > 1 else 0):
            rng.shuffle(cands)
            data.append(chat(day["system"], day["task"], [a for a, _ in cands], best_index([s for _, s in cands])))
    out = home / f"selector-s{args.steps}-lr{args.lr}"
    if not (out / "config.json").exists():
        model = load_trained_model(args.solver, plan.settings.model, torch.device("cpu"))
        loss = train_sft(model, tokenizer, data, steps=args.steps, lr=args.lr, batch_samples=args.batch,
                         warmup_steps=min(20, args.steps), seed=args.seed)
        save_hf_folder(model, tokenizer, out)
        print(f"selector: SFT on {len(data)} chats, last loss {loss:.4f} -> {out}", flush=True)
    model = load_trained_model(str(out), plan.settings.model, torch.device("cpu")).eval()

    def pick(system: str, task: str, answers: list[str]) -> int:
        likelihoods = []
        for k in range(len(answers)):
            ids, mask = chat(system, task, answers, k)
            with torch.no_grad():
                logp = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
            chosen = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            likelihoods.append(float(chosen[torch.tensor(mask[1:], dtype=torch.bool)].sum()))
        return best_index(likelihoods)

    files = sorted(glob.glob(args.baseline))
    if not files:
        raise SystemExit(f"no baseline files match {args.baseline!r}")
    prompts: dict[int, tuple[str, str]] = {}
    columns = ("picked", "random pick", "per-hour vote", "best", "maj")
    table: list[list[tuple[float, ...]]] = []
    for path in files:
        rows = []
        for record in (json.loads(line) for line in gzip.open(path, "rt")):
            index = record["index"]
            if index not in prompts:
                turn = opening_turn(plan.bundle, "eval", index)
                prompts[index] = (turn.system_prompt, turn.prompt)
            cands = [(s["answer"], s["score"]) for s in record["samples"][:args.samples]
                     if not s.get("failure") and s["answer"]]
            maj = majority_score(record)
            if not cands:
                rows.append((0.0, 0.0, 0.0, 0.0, maj))
                continue
            scores = [s for _, s in cands]
            cents, battery, best = parse_day(plan.bundle.row("eval", index))
            schedules = [s for s in (_schedule(a) for a, _ in cands) if s is not None]
            vote = score(profit_units(cents, per_hour_vote(schedules, battery.duration_h), battery), best) \
                if schedules else 0.0
            rows.append((scores[pick(*prompts[index], [a for a, _ in cands])], st.mean(scores), vote,
                         max(scores), maj))
        table.append(rows)
        print(f"{Path(path).name}: " + ", ".join(f"{c} {st.mean(r[i] for r in rows):.4f}"
                                                 for i, c in enumerate(columns)), flush=True)
    n = len(table[0])
    for i, name in ((4, "maj"), (1, "random pick"), (2, "per-hour vote")):
        diffs = [st.mean(t[j][0] - t[j][i] for t in table) for j in range(n)]
        print(f"picked - {name}, paired per day over {len(table)} seeds: {st.mean(diffs):+.4f} ± "
              f"{st.stdev(diffs) / n ** 0.5:.4f}", flush=True)


if __name__ == "__main__":
    main()
