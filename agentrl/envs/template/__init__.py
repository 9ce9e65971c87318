"""`python -m agentrl.envs new NAME`: a bundle folder of your own from a template that passes its own test.

The folder holds `bundle.json` (the manifest, kind `bundle.py:<Name>Bundle`), `bundle.py` (the episode and
bundle classes to edit), `train.jsonl`/`eval.jsonl` (the tasks: a word to reverse) and `test_bundle.py`.
`refresh` rewrites the manifest's counts and fingerprints after the data files were edited.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from agentrl.envs.bundles import MANIFEST, file_sha256, read_jsonl

HERE = Path(__file__).resolve().parent
_WORDS = ("apple banana cherry dragon engine forest garden harbor island jungle kettle lemon market needle "
          "orange pepper quartz river silver tunnel umbrella valley window yellow zebra anchor basket candle "
          "dinner eagle falcon ginger helmet igloo jacket koala ladder mirror nectar oyster pencil rabbit").split()
_EVAL = 10  # the last words are the eval split: no task is in both


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^0-9a-zA-Z]+", name) if part) or "My"


def _rows(words: list[str], name: str, split: str) -> list[dict[str, str]]:
    return [{"task_id": f"{name}-{split}-{i:04d}", "word": w, "answer": w[::-1]} for i, w in enumerate(words)]


def refresh(folder: str | Path) -> dict:
    """Rewrite `bundle.json`'s split counts and file fingerprints from the data files as they are now."""
    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    for entry in manifest["splits"].values():
        entry["count"] = len(read_jsonl(folder / entry["file"]))
    manifest["files"] = {e["file"]: file_sha256(folder / e["file"]) for e in manifest["splits"].values()}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def new_bundle(name: str, parent: str | Path = ".", *, force: bool = False) -> Path:
    """Write the bundle folder `parent/name`; refuses an existing folder unless `force`."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise ValueError(f"a bundle name is letters, digits, _ and - (starting with a letter), not {name!r}")
    folder = Path(parent) / name
    if folder.exists() and not force:
        raise FileExistsError(f"{folder} already exists (pass --force to overwrite)")
    folder.mkdir(parents=True, exist_ok=True)
    cls = class_name(name)
    for template in ("bundle.py", "test_bundle.py"):
        text = (HERE / f"{template}.tmpl").read_text().format(name=name, cls=cls)
        (folder / template).write_text(text)
    splits = {"train": _WORDS[:-_EVAL], "eval": _WORDS[-_EVAL:]}
    for split, words in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(words, name, split)))
    manifest = {"name": name, "version": "1", "kind": f"bundle.py:{cls}Bundle",
                "description": f"{name}: reverse a word (the template's task; edit bundle.py and the data)",
                "splits": {s: {"file": f"{s}.jsonl", "count": 0} for s in splits},
                "toolsets": {"default": ["answer"]}, "files": {}}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    refresh(folder)
    return folder
