"""Regenerate the stored arith problem files and manifest, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.envs.bundles import MANIFEST, shipped_folder, write_jsonl_gz

from .problems import GENERATOR_VERSION, generate_split

KIND = "agentrl.envs.bundles.arith.bundle:ArithBundle"
DEFAULT_FOLDER = shipped_folder("arith")


def build(folder: Path = DEFAULT_FOLDER) -> dict[str, Any]:
    """Write `{train,eval}.jsonl.gz` and `bundle.json` into `folder`; eval first, train avoids its problems."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    eval_rows = generate_split("eval")
    train_rows = generate_split("train", avoid={r["prompt"][0]["content"] for r in eval_rows})
    files, splits = {}, {}
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        name = f"{split}.jsonl.gz"
        files[name] = write_jsonl_gz(folder / name, rows)
        splits[split] = {"file": name, "count": len(rows)}
    manifest = {
        "name": "arith",
        "version": "1",
        "generator": GENERATOR_VERSION,
        "kind": KIND,
        "description": "Integer-answer arithmetic, modular and word problems in five levels; DAPO-Math rows "
                       "(prompt, label), graded 1/0 on the final answer.",
        "splits": splits,
        "toolsets": {"default": ["submit_answer"]},
        "scores": ["correct"],
        "files": files,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
