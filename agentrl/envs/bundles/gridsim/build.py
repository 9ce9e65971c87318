"""Regenerate the stored GridSim packs and manifest, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.envs.bundles import MANIFEST, shipped_folder, write_jsonl_gz

from .baselines import baseline_table
from .prompts import TOOL_NAME
from .tasks import GENERATOR_VERSION, SPLIT_SIZES, make_task

KIND = "agentrl.envs.bundles.gridsim.bundle:GridSimBundle"
DEFAULT_FOLDER = shipped_folder("gridsim")


def generate_split(split: str) -> list[dict[str, Any]]:
    return [make_task(split, i) for i in range(SPLIT_SIZES[split])]


def build(folder: Path = DEFAULT_FOLDER) -> dict[str, Any]:
    """Write `{train,eval}.jsonl.gz` and `bundle.json` into `folder`; returns the manifest."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files, splits, baselines = {}, {}, {}
    for split in ("train", "eval"):
        rows = generate_split(split)
        name = f"{split}.jsonl.gz"
        files[name] = write_jsonl_gz(folder / name, rows)
        splits[split] = {"file": name, "count": len(rows)}
        baselines[split] = baseline_table(rows)
    manifest = {
        "name": "gridsim",
        "version": "1",
        "generator": GENERATOR_VERSION,
        "kind": KIND,
        "description": "One grid battery for one day of ERCOT-style day-ahead prices, graded against the exact "
                       "optimum (0.2 idle, 1.0 optimum).",
        "splits": splits,
        "toolsets": {"default": [TOOL_NAME]},
        "scores": ["grade"],
        "files": files,
        "baselines": baselines,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
