"""Regenerate the stored calc problem files and manifest, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.envs.bundles import MANIFEST, shipped_folder, write_jsonl_gz

from .problems import GENERATOR_VERSION, generate_split

KIND = "agentrl.envs.bundles.calc.bundle:CalcBundle"
DEFAULT_FOLDER = shipped_folder("calc")


def build(folder: Path = DEFAULT_FOLDER) -> dict[str, Any]:
    """Write `{train,eval}.jsonl.gz` and `bundle.json` into `folder`; eval first, train avoids its questions."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    eval_rows = generate_split("eval")
    train_rows = generate_split("train", avoid={r["question"] for r in eval_rows})
    files, splits = {}, {}
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        name = f"{split}.jsonl.gz"
        files[name] = write_jsonl_gz(folder / name, rows)
        splits[split] = {"file": name, "count": len(rows)}
    manifest = {
        "name": "calc",
        "version": "1",
        "generator": GENERATOR_VERSION,
        "kind": KIND,
        "description": "Integer arithmetic (add, mul, div, word problems; three levels) solved through a "
                       "calculate tool and answered with submit_answer; graded 0.1 tool_used + 0.1 submitted "
                       "+ 0.8 correct.",
        "splits": splits,
        "toolsets": {"default": ["calculate", "submit_answer"]},
        "scores": ["grade"],
        "files": files,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
