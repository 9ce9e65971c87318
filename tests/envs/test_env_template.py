"""`python -m agentrl.envs new NAME`: the folder it writes loads as a bundle and passes its own test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.envs.__main__ import main
from agentrl.envs.bundles import BundleError, load_bundle


def own_test(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_bundle.py"],
                          cwd=folder, capture_output=True, text=True, timeout=600)


def test_new_bundle_passes_its_own_test_and_fails_it_when_broken(tmp_path: Path):
    assert main(["new", "word-flip", "--dir", str(tmp_path)]) == 0
    folder = tmp_path / "word-flip"
    bundle = load_bundle(str(folder))
    assert type(bundle).__name__ == "WordFlipBundle" and bundle.teachers == ("label",)
    train = {bundle.row("train", i)["word"] for i in range(bundle.splits()["train"])}
    assert not train & {bundle.row("eval", i)["word"] for i in range(bundle.splits()["eval"])}
    proc = own_test(folder)
    assert proc.returncode == 0, proc.stdout[-2000:]
    code = (folder / "bundle.py").read_text()
    (folder / "bundle.py").write_text(code.replace("return 1.0 if", "return 0.0 if"))  # a broken grader
    proc = own_test(folder)
    assert proc.returncode != 0 and "failed" in proc.stdout


def test_edited_data_needs_refresh_and_new_refuses_an_existing_folder(tmp_path: Path, capsys):
    assert main(["new", "puzzles", "--dir", str(tmp_path)]) == 0
    folder = tmp_path / "puzzles"
    with open(folder / "eval.jsonl", "a") as f:
        f.write(json.dumps({"task_id": "puzzles-eval-extra", "word": "ab", "answer": "ba"}) + "\n")
    with pytest.raises(BundleError, match="altered"):
        load_bundle(str(folder))
    assert main(["refresh", str(folder)]) == 0
    assert load_bundle(str(folder)).splits()["eval"] == 11
    assert main(["new", "puzzles", "--dir", str(tmp_path)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["new", "9lives", "--dir", str(tmp_path)]) == 1
