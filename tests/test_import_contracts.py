"""The import contracts in pyproject.toml (`lint-imports`) list backend files and bundles by hand: a file or bundle
added without its entry would go unguarded. Every backend file (trainers/grpo*, trl*, miles*, sft*, the warm
start, the TRL rank entry) is in one backend's contract, and every backend's contract forbids each other backend
whole or not at all; every bundle is in the bundles-are-plugins and sibling-independence contracts."""

from __future__ import annotations

import tomllib
from pathlib import Path

from agentrl.envs.bundles import GENERATED

REPO = Path(__file__).resolve().parents[1]


def contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def backend_files() -> set[str]:
    trainers = REPO / "agentrl" / "trainers"
    found = {f"agentrl.trainers.{p.parent.name}.{p.stem}" for backend in ("trl", "miles")
             for p in (trainers / backend).glob("*.py") if p.stem != "__init__"}
    return found | {"agentrl.trainers.grpo.trainer", "agentrl.trainers.sft.trainer", "agentrl.trainers.sft.state",
                    "agentrl.trainers.sft.warm_start", "agentrl.trl_rank"}


def bundles() -> set[str]:
    envs = REPO / "agentrl" / "envs"
    folders = {p.parent.name for p in [*envs.glob("*/bundle.py"), *envs.glob("*/bundle.py.tmpl")]}
    generated = {target.split(":")[0].removeprefix("agentrl.envs.") for target in GENERATED.values()}
    return {f"agentrl.envs.{name}" for name in folders | generated}


def test_every_backend_file_is_in_one_backend_contract() -> None:
    backends = {cid: c for cid, c in contracts().items() if cid.startswith("backends-are-independent-")}
    owners = {m: [cid for cid, c in backends.items() if m in c["source_modules"]] for m in backend_files()}
    assert {m: cids for m, cids in owners.items() if len(cids) != 1} == {}
    for cid, c in backends.items():
        for other, d in backends.items():
            forbidden = set(d["source_modules"]) & set(c["forbidden_modules"])
            assert forbidden in (set(), set(d["source_modules"])), f"{cid} forbids only part of {other}"


def test_every_bundle_is_guarded() -> None:
    c = contracts()
    found = bundles()
    assert {"agentrl.envs.gridsim", "agentrl.envs.mix", "agentrl.envs.template"} <= found, found
    assert found - set(c["sibling-bundles-are-independent"]["modules"]) == set()
    # A bundle's own modules beside it (mix_groups is the mix's) are guarded with it.
    own = {f"agentrl.envs.{p.stem}" for p in (REPO / "agentrl" / "envs").glob("*.py")
           if any(p.stem.startswith(b.rsplit(".", 1)[1] + "_") for b in found)}
    assert (found | own) - set(c["bundles-are-plugins"]["forbidden_modules"]) == set()
