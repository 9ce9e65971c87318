"""`python -m agentrl.envs.bundles.gridsim build` reproduces the stored packs bit for bit; `baselines` prints the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.envs.bundles import read_manifest, shipped_folder
from agentrl.testing.cli import run_cli


def _cli(*args: str) -> str:
    return run_cli(args, module="agentrl.envs.bundles.gridsim", check=True).stdout


@pytest.mark.slow
def test_build_reproduces_the_stored_fingerprints_and_manifest(tmp_path: Path):
    manifest = json.loads(_cli("build", "--out", str(tmp_path), "--json"))
    stored = read_manifest(shipped_folder("gridsim"))
    assert manifest["files"] == stored["files"]
    assert (tmp_path / "bundle.json").read_bytes() == (shipped_folder("gridsim") / "bundle.json").read_bytes()


def test_arith_build_reproduces_the_stored_fingerprints(tmp_path: Path):
    from agentrl.envs.bundles.arith.build import build

    assert build(tmp_path)["files"] == read_manifest(shipped_folder("arith"))["files"]


def test_baselines_cli_orders_the_policies_and_matches_the_manifest():
    table = json.loads(_cli("baselines", "--split", "eval", "--json"))
    assert list(table) == ["1h", "2h", "4h", "all"]
    all_ = table["all"]
    assert all_["idle"] == 0.2 and all_["optimum"] == 1.0
    assert all_["random_feasible"] < all_["idle"] < all_["fixed_clock"] < all_["greedy"] \
        < all_["best_single_cycle"] < all_["optimum"]
    assert table == read_manifest(shipped_folder("gridsim"))["baselines"]["eval"]
    text = _cli("baselines")
    assert "greedy" in text and "4h" in text.splitlines()[1]
