"""The import contracts in pyproject.toml (`lint-imports`) name backend packages and bundles by hand: a backend or
bundle added without its entry would go unguarded. Every backend is a package under agentrl/trainers/ (no module
sits loose there); grpo, trl and miles are in the backends' independence contract, sft (the layer grpo and trl
build on) forbids each of them and the TRL rank entry, the rank entry forbids every backend but TRL, and common
forbids them all. Every bundle is a package under agentrl/envs/bundles/ (its code, and its data in data/): each is in
the sibling-independence contract, and the bundles-are-plugins contract forbids the bundles package whole."""

from __future__ import annotations

import tomllib
from pathlib import Path

from agentrl.envs.bundles import GENERATED, shipped_bundles

REPO = Path(__file__).resolve().parents[1]
TRAINERS = REPO / "agentrl" / "trainers"
BUNDLES = REPO / "agentrl" / "envs" / "bundles"
SHARED = "agentrl.trainers.common"  # what several backends share: a package, but no backend
SFT = "agentrl.trainers.sft"  # the layer grpo and trl build on (the warm start): below them, not beside them
TRL_RANK = "agentrl.trl_rank"  # TRL's rank entry, above the plan (it composes), so outside trainers/


def contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def backend_packages() -> set[str]:
    return {f"agentrl.trainers.{p.parent.name}" for p in TRAINERS.glob("*/__init__.py")} - {SHARED}


def bundles() -> set[str]:
    """Every bundle package (agentrl/envs/bundles/<name>/), and the template for one's own (agentrl/envs/template)."""
    packages = {f"agentrl.envs.bundles.{p.parent.name}" for p in BUNDLES.glob("*/__init__.py")}
    templates = {f"agentrl.envs.{p.parent.name}" for p in (REPO / "agentrl" / "envs").glob("*/bundle.py.tmpl")}
    return packages | templates


def test_every_backend_is_a_package_in_the_backend_contracts() -> None:
    c = contracts()
    found = backend_packages()
    assert {"agentrl.trainers.grpo", "agentrl.trainers.trl", "agentrl.trainers.miles", SFT} <= found, found
    assert sorted(p.name for p in TRAINERS.glob("*.py")) == ["__init__.py"], "a module loose in trainers/"
    independent = set(c["backends-are-independent"]["modules"])
    assert independent == found - {SFT}
    assert c["sft-imports-no-backend"]["source_modules"] == [SFT]
    assert set(c["sft-imports-no-backend"]["forbidden_modules"]) == independent | {TRL_RANK}
    assert c["trl-rank-is-trl"]["source_modules"] == [TRL_RANK]
    assert set(c["trl-rank-is-trl"]["forbidden_modules"]) == independent - {"agentrl.trainers.trl"}
    assert c["common-imports-no-backend"]["source_modules"] == [SHARED]
    assert set(c["common-imports-no-backend"]["forbidden_modules"]) == found | {TRL_RANK}


def test_every_bundle_is_guarded() -> None:
    c = contracts()
    found = bundles()
    assert {"agentrl.envs.bundles.gridsim", "agentrl.envs.bundles.mix", "agentrl.envs.template"} <= found, found
    # Every bundle is a package: a module loose beside the loader would be guarded by no independence contract.
    assert sorted(p.name for p in BUNDLES.glob("*.py")) == ["__init__.py"], "a module loose in envs/bundles/"
    assert set(c["sibling-bundles-are-independent"]["modules"]) == found
    # Every bundle the loader builds by name (GENERATED) is one of those packages, and so is every shipped one.
    generated = {target.split(":")[0] for target in GENERATED.values()}
    assert generated <= found, generated - found
    assert {f"agentrl.envs.bundles.{name}" for name in shipped_bundles()} <= found
    # The plugins contract forbids the bundles package whole (each bundle in it) and the template.
    assert set(c["bundles-are-plugins"]["forbidden_modules"]) == {"agentrl.envs.bundles", "agentrl.envs.template"}
