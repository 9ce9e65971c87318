"""Expert iteration (ReST-EM / RAFT) from the greedy rule's imitation: issue 33 proof 1's untried lever.

    python benchmarks/studies/expert_iteration.py --home H --start START --seed 0 --rounds 6 --days 500 \
        --samples 16 --temperature 1.0 --sft-steps 200 --lr 1e-3

Each round plays `--days` train days (the next slice of the 2,000 stored ones, wrapping) `--samples` times
each at `--temperature` on the current model, keeps each day's best schedule seen so far (a buffer over rounds:
a day's entry changes only when a sample scores higher; failed or zero-scored replies never enter), then
fine-tunes the current model on the buffer (SFT on the model's own tokens, the assistant tokens only) and plays
the eval split as `gridsim_beat_teacher` evaluates (T=0.8, 200 days) and greedy-decoded. The reward is the
grader's exact score and nothing else: what improves is the model's own best, distilled at SFT's learning rate,
where GRPO's rate (5e-5; 1e-4 collapsed a seed) moves it little per step.

Per round it prints one line (buffer mean = the best-so-far schedules' mean score on the days seen) and writes
`H/ei/seed-S/round-R/` (a model folder) and `H/ei/seed-S/rounds.jsonl`. Evaluate the last with
`python -m agentrl eval +recipe=gridsim_beat_teacher seed=S eval.model=... eval.limit=200 eval.temperature=0.8`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import plan_for  # noqa: E402 - the sibling benchmark's helper

from agentrl.testing.config import compose_config  # noqa: E402

RECIPE = "gridsim_beat_teacher"


def best_per_day(per_row: list, indices: list[int]) -> dict[int, tuple[float, list[int], list[int]]]:
    """Each day's best scored play: (score, token ids, loss mask); days whose plays all failed or scored 0 are
    left out."""
    from agentrl.play.evaluate import outcome_of

    best: dict[int, tuple[float, list[int], list[int]]] = {}
    for index, plays in zip(indices, per_row, strict=True):
        for play in plays:
            r = outcome_of(play)
            if r.failure is not None or r.score <= 0 or r.sample is None or not r.sample.token_ids:
                continue
            if index not in best or r.score > best[index][0]:
                best[index] = (r.score, list(r.sample.token_ids), list(r.sample.loss_mask))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--start", required=True, help="the model folder round 1 samples from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--days", type=int, default=500, help="train days played a round")
    ap.add_argument("--samples", type=int, default=16, help="plays a day a round")
    ap.add_argument("--temperature", type=float, default=1.0, help="the sampling temperature of the rounds' plays")
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-limit", type=int, default=200)
    args, extra = ap.parse_known_args()
    home = Path(args.home)
    os.environ["AGENTRL_HOME"] = str(home)
    import torch
    from transformers import AutoTokenizer

    from agentrl.devices import set_threads
    from agentrl.play.evaluate import evaluate, outcome_of, play_tasks
    from agentrl.play.rollout import make_row
    from agentrl.play.services import start_services
    from agentrl.trainers.common.trained_model import load_trained_model
    from agentrl.trainers.sft.trainer import save_hf_folder, train_sft

    cfg = compose_config(f"+recipe={RECIPE}", f"seed={args.seed}", *extra)
    out = home / "ei" / f"seed-{args.seed}"
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_for(cfg, out / "run")
    set_threads(plan.settings)
    bundle, run = plan.bundle, plan.settings
    train = run.env.train_split
    n_train = len(bundle.rows(train))
    order = list(range(n_train))
    random.Random(args.seed).shuffle(order)
    buffer: dict[int, tuple[float, list[int], list[int]]] = {}
    model_path = str(args.start)
    log = (out / "rounds.jsonl").open("a")
    started = time.monotonic()

    def play_eval(path: str) -> dict[str, float]:
        svc = start_services(plan, path)
        try:
            m, _ = evaluate(svc, bundle, run.env.eval_split, limit=args.eval_limit, quiet=True,
                            sampling=plan.sampling, seed_parts=(args.seed, "ei-eval"))
            g, _ = evaluate(svc, bundle, run.env.eval_split, limit=args.eval_limit, quiet=True,
                            sampling=plan.sampling.greedy_copy(), prefix="eval_greedy")
        finally:
            svc.close()
        return {**m, **g}

    m = play_eval(model_path)
    print(f"round 0: eval {m['eval/reward']:.3f} greedy {m['eval_greedy/reward']:.3f} ({model_path})", flush=True)
    for rnd in range(1, args.rounds + 1):
        t0 = time.monotonic()
        first = ((rnd - 1) * args.days) % n_train
        indices = [order[(first + k) % n_train] for k in range(args.days)]
        svc = start_services(plan, model_path)
        try:
            rows = [make_row(bundle, train, i, svc.env_url, svc.env_settings) for i in indices]
            per_row = play_tasks(svc, rows, samples=args.samples, sampling=plan.sampling.at(args.temperature),
                                 seed_parts=(args.seed, "ei", rnd))
        finally:
            svc.close()
        scores = [outcome_of(p).score for plays in per_row for p in plays]
        found = best_per_day(per_row, indices)
        improved = 0
        for day, entry in found.items():
            if day not in buffer or entry[0] > buffer[day][0]:
                buffer[day], improved = entry, improved + 1
        play_s = time.monotonic() - t0
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = load_trained_model(model_path, run.model, torch.device("cpu"))
        data = [(ids, mask) for _, ids, mask in buffer.values()]
        loss = train_sft(model, tokenizer, data, steps=args.sft_steps, lr=args.lr, batch_samples=args.batch,
                         warmup_steps=min(10, args.sft_steps), seed=args.seed * 1000 + rnd)
        model_path = str(save_hf_folder(model, tokenizer, out / f"round-{rnd}"))
        del model
        m = play_eval(model_path)
        best_of = sum(found[d][0] if d in found else 0.0 for d in indices) / len(indices)
        line = {"round": rnd, "sample_mean": sum(scores) / len(scores), "best_of_n": best_of,
                "buffer_days": len(buffer), "buffer_mean": sum(e[0] for e in buffer.values()) / len(buffer),
                "improved": improved, "sft_loss": loss, "eval": m["eval/reward"], "eval_greedy": m["eval_greedy/reward"],
                **{k: m[k] for k in m if k.startswith("eval/reward_") and k[-1] == "h"},
                "play_s": round(play_s, 1), "wall_min": round((time.monotonic() - started) / 60, 2)}
        log.write(json.dumps(line) + "\n")
        log.flush()
        print(f"round {rnd}: samples {line['sample_mean']:.3f} best-of-{args.samples} {best_of:.3f} buffer "
              f"{line['buffer_mean']:.3f} on {len(buffer)} days ({improved} improved), SFT loss {loss:.4f}; eval "
              f"{m['eval/reward']:.3f} greedy {m['eval_greedy/reward']:.3f}; {line['wall_min']} min", flush=True)


if __name__ == "__main__":
    main()
