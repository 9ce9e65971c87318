"""The tokenizer corpus: the frozen bundle chats still match the shipped bundles, and the models layer reads
them without importing a bundle."""

from __future__ import annotations

import subprocess
import sys

from agentrl.envs.corpus import tokenizer_chats
from agentrl.models.corpus import bundle_chats


def test_frozen_bundle_chats_match_the_shipped_bundles() -> None:
    fresh: dict[str, list] = {}
    for record in tokenizer_chats():
        fresh.setdefault(record["source"], []).append((record["messages"], record["tools"]))
    frozen = bundle_chats()
    assert list(frozen) == ["gridsim:compact", "gridsim:full", "arith"]
    # On a mismatch: python -m agentrl.envs.corpus agentrl/models/tokenizer_chats.jsonl.gz, and bump
    # agentrl.models.tiny.BUILDER_VERSION (the tokenizer of a new build changes).
    assert frozen == fresh


def test_making_the_corpus_imports_no_env_code() -> None:
    code = ("import sys; from agentrl.models.corpus import corpus; texts, sources = corpus(synthetic_chats=5); "
            "assert 'gridsim:full' in sources, sources; "
            "print(sorted(m for m in sys.modules if m.startswith('agentrl.envs')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
