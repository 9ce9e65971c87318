"""The shipped bundles' chats as sample text: what the tiny model's tokenizer learns their prompts from.

`agentrl/models/tokenizer_chats.jsonl.gz` holds them, frozen, so that the models layer never imports a bundle
(tests/models/test_corpus.py checks that the file still matches these bundles). After a change to a shipped
bundle's prompts, tools or demonstrations, regenerate it and bump the tiny builder's BUILDER_VERSION:

    python -m agentrl.envs.corpus agentrl/models/tokenizer_chats.jsonl.gz
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.envs.bundles import load_bundle

# (bundle, options) whose chats join the corpus, in corpus order.
SOURCES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("gridsim", {"prompt_style": "compact"}), ("gridsim", {"prompt_style": "full"}), ("arith", {}))
TASKS_PER_SPLIT = 150
# The teachers asked for, alternately. They were GridSim's when the corpus was first made; a bundle that lacks
# one (arith: greedy) gives the opening turn instead. Kept as they were: the tokenizer must not change.
TEACHERS = ("optimal", "greedy")


def source_label(name: str, options: dict[str, Any]) -> str:
    """`gridsim:compact`, `arith`: a source's name in the tiny model's build record."""
    return ":".join([name, *map(str, options.values())])


def bundle_chats(name: str, per_split: int, **options: Any) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """(messages, tools) of the first `per_split` tasks of each split of a shipped bundle: a teacher's
    demonstration where it has one, else the opening turn."""
    bundle = load_bundle(bundle=name, **options)
    for split, count in sorted(bundle.splits().items()):
        for index in range(min(count, per_split)):
            turn = bundle.episode(split, index).first_turn()
            msgs = [{"role": "system", "content": turn.system_prompt}, {"role": "user", "content": turn.prompt}]
            try:
                demo = bundle.demonstration(split, index, TEACHERS[index % 2])
            except Exception:  # noqa: BLE001 - demonstrations are optional; many bundles have none
                demo = None
            yield (demo or msgs), turn.tools


def tokenizer_chats() -> list[dict[str, Any]]:
    """Every source's chats as records {"source", "messages", "tools"}, in corpus order."""
    return [{"source": source_label(name, options), "messages": msgs, "tools": tools}
            for name, options in SOURCES for msgs, tools in bundle_chats(name, TASKS_PER_SPLIT, **options)]


def write_tokenizer_chats(path: str | Path) -> str:
    """Write `tokenizer_chats()` as reproducible gzip JSON Lines (keys in their order); returns the sha256."""
    import gzip
    import hashlib
    import io

    # Not write_jsonl_gz: it sorts keys, and the template renders tool schemas in their own key order.
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in tokenizer_chats())
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    Path(path).write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


if __name__ == "__main__":  # pragma: no cover - a maintainer's command
    print(write_tokenizer_chats(sys.argv[1]))
