"""atomic_dir: a folder is replaced whole, or left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.fsutil import atomic_dir


def test_a_complete_folder_replaces_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target and not target.exists()
        (tmp / "a.txt").write_text("one")
    with atomic_dir(target) as tmp:
        (tmp / "b.txt").write_text("two")
        assert (target / "a.txt").read_text() == "one"  # readers see the old folder until the end
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary or old folder left


def test_a_failure_leaves_the_old_folder_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(OSError, match="disk full"), atomic_dir(target) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise OSError("disk full")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_failed_rename_puts_the_old_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("one")
    real_rename = os.rename

    def rename(src, dst):  # the move aside works; the move into place fails
        if Path(src).name.startswith(".model.tmp-"):
            raise OSError("cross-device link")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="cross-device"), atomic_dir(target) as tmp:
        (tmp / "b.txt").write_text("two")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
