"""The import contracts in pyproject.toml (`lint-imports`) name backend packages and bundles by hand: a backend or
bundle added without its entry would go unguarded. Every backend is a package under agentrl/trainers/ (no module
sits loose there); grpo, trl and miles are in the backends' independence contract, sft (the layer grpo and trl
build on) forbids each of them and the TRL rank entry, the rank entry forbids every backend but TRL, and common
forbids them all; every bundle is in the bundles-are-plugins and sibling-independence contracts."""

from __future__ import annotations

import tomllib
from pathlib import Path

from agentrl.envs.bundles import GENERATED

REPO = Path(__file__).resolve().parents[1]
TRAINERS = REPO / "agentrl" / "trainers"
SHARED = "agentrl.trainers.common"  # what several backends share: a package, but no backend
SFT = "agentrl.trainers.sft"  # the layer grpo and trl build on (the warm start): below them, not beside them
TRL_RANK = "agentrl.trl_rank"  # TRL's rank entry, above the plan (it composes), so outside trainers/


def contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def backend_packages() -> set[str]:
    return {f"agentrl.trainers.{p.parent.name}" for p in TRAINERS.glob("*/__init__.py")} - {SHARED}


def bundles() -> set[str]:
    envs = REPO / "agentrl" / "envs"
    folders = {p.parent.name for p in [*envs.glob("*/bundle.py"), *envs.glob("*/bundle.py.tmpl")]}
    generated = {target.split(":")[0].removeprefix("agentrl.envs.") for target in GENERATED.values()}
    return {f"agentrl.envs.{name}" for name in folders | generated}


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
    assert {"agentrl.envs.gridsim", "agentrl.envs.mix", "agentrl.envs.template"} <= found, found
    assert found - set(c["sibling-bundles-are-independent"]["modules"]) == set()
    # A bundle's own modules beside it (mix_groups is the mix's) are guarded with it.
    own = {f"agentrl.envs.{p.stem}" for p in (REPO / "agentrl" / "envs").glob("*.py")
           if any(p.stem.startswith(b.rsplit(".", 1)[1] + "_") for b in found)}
    assert (found | own) - set(c["bundles-are-plugins"]["forbidden_modules"]) == set()
