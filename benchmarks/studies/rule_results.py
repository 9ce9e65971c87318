"""GridSim's greedy rule (the teacher of `gridsim_beat_teacher`) as a per-task results file, the format
`agentrl eval` writes, so `agentrl compare` pairs a model's eval against the rule by eval day.

    python benchmarks/studies/rule_results.py --out rule.jsonl [--limit N] [-- hydra overrides]
    python -m agentrl compare <eval run id or evals/eval.jsonl> rule.jsonl

The rule is a program, not a model, so `agentrl eval` cannot play it: its score per day is the grader's
(`envs/bundles/gridsim/baselines.py`), the same numbers `algorithms.py beat` pairs against.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentrl.play.eval_results import write_results  # noqa: E402
from agentrl.testing.config import compose_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=None, help="the first N eval days (default: all)")
    parser.add_argument("--recipe", default="gridsim_beat_teacher")
    args, extra = parser.parse_known_args()
    from hydra.utils import instantiate

    from agentrl.envs.bundles.gridsim.baselines import baseline_scores

    cfg = compose_config(*[f"+recipe={args.recipe}", *[x for x in extra if x != "--"]])
    bundle, split = instantiate(cfg.env), str(cfg.env.eval_split)
    rows = bundle.rows(split)[: args.limit] if args.limit else bundle.rows(split)
    records = []
    for i, row in enumerate(rows):
        info = bundle.task_info(split, i)
        facts = {f: info.extra[f] for f in bundle.eval_breakdown if f in info.extra}
        records.append({"task_id": info.task_id, "split": split, "index": i, "facts": facts,
                        "samples": [{"score": baseline_scores(row)["greedy"], "reward": None}]})
    path = write_results(Path(args.out), records)
    print(f"greedy rule on {len(records)} {split} days: mean {sum(r['samples'][0]['score'] for r in records) / len(records):.4f} -> {path}")


if __name__ == "__main__":
    main()
