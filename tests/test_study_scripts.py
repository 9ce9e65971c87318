"""The benchmark and study scripts import and parse their arguments: they are run by hand, so a refactor that
breaks one (a helper moved between modules) would otherwise surface only in the next proof session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").rglob("*.py")
                 if "if __name__" in p.read_text() and "argparse" in p.read_text())


def test_scripts_found() -> None:
    assert any(p.parent.name == "studies" for p in SCRIPTS), SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_help(script: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=script.parent, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
