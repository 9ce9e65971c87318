"""load_bundle and bundle folders: shipped names, paths, options, fingerprints, spec round trips, import weight."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.envs.bundles import BundleError, load_bundle, read_manifest, shipped_bundles, shipped_folder

REPO = Path(__file__).resolve().parents[2]


def test_shipped_bundles_load_with_expected_splits():
    assert {"gridsim", "arith"} <= set(shipped_bundles())
    assert load_bundle("gridsim").splits() == {"train": 2000, "eval": 200}
    arith = load_bundle("arith").splits()
    assert arith["train"] >= 2000 and 200 <= arith["eval"] <= 1000


def test_shipped_bundles_stay_small():
    files = [p for name in shipped_bundles() for p in shipped_folder(name).rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total < 3_000_000


def test_server_settings_are_ignored_and_unknown_options_named():
    bundle = load_bundle("gridsim", server={"url": None, "port": 0}, prompt_style="compact")
    assert bundle.prompt_style == "compact"
    with pytest.raises(TypeError, match="'prompt_stile'"):
        load_bundle("gridsim", prompt_stile="compact")
    with pytest.raises(TypeError, match="'data_file'"):
        load_bundle("gridsim", data_file="x.jsonl")
    with pytest.raises(ValueError, match="prompt_style"):
        load_bundle("gridsim", prompt_style="verbose")


def test_bad_split_roles_and_unknown_bundle_fail_clearly():
    with pytest.raises(ValueError, match="'test'"):
        load_bundle("gridsim", eval_split="test")
    with pytest.raises(BundleError, match="unknown bundle 'nope'"):
        load_bundle("nope")


def test_hydra_instantiates_the_env_config():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from agentrl.config.env import ArithEnvConfig, GridSimEnvConfig

    grid = instantiate(OmegaConf.structured(GridSimEnvConfig(prompt_style="compact")))
    assert grid.spec() == {"bundle": "gridsim", "train_split": "train", "eval_split": "eval",
                           "prompt_style": "compact"}
    arith = instantiate(OmegaConf.structured(ArithEnvConfig))
    assert arith.spec()["bundle"] == "arith" and arith.splits()["eval"] > 0


@pytest.fixture
def gridsim_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "my-gridsim"
    shutil.copytree(shipped_folder("gridsim"), folder)
    return folder


def test_folder_path_loads_and_spec_names_the_absolute_folder(gridsim_copy: Path):
    bundle = load_bundle(str(gridsim_copy))
    assert bundle.spec()["bundle"] == str(gridsim_copy.resolve())
    assert bundle.task_info("eval", 7) == load_bundle("gridsim").task_info("eval", 7)


def test_missing_data_file_is_named(gridsim_copy: Path):
    (gridsim_copy / "eval.jsonl.gz").unlink()
    with pytest.raises(BundleError, match=r"eval\.jsonl\.gz is missing"):
        load_bundle(str(gridsim_copy))


def test_altered_data_file_reports_expected_and_actual(gridsim_copy: Path):
    path = gridsim_copy / "train.jsonl.gz"
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    expected = read_manifest(gridsim_copy)["files"]["train.jsonl.gz"]
    with pytest.raises(BundleError, match="train.jsonl.gz was altered") as err:
        load_bundle(str(gridsim_copy))
    assert expected in str(err.value) and "actual" in str(err.value)


def test_manifest_without_fingerprints_is_rejected(gridsim_copy: Path):
    manifest = json.loads((gridsim_copy / "bundle.json").read_text())
    del manifest["files"]["eval.jsonl.gz"]
    (gridsim_copy / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="no fingerprint"):
        load_bundle(str(gridsim_copy))


def test_folder_without_manifest(tmp_path: Path):
    with pytest.raises(BundleError, match="has no bundle.json"):
        load_bundle(str(tmp_path))


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from agentrl.envs.bundles import load_bundle
spec = json.loads(sys.argv[2])
b = load_bundle(**spec)
ep = b.episode("eval", 3)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in
               ("numpy", "torch", "hydra", "omegaconf", "fastapi", "transformers", "scipy"))
print(json.dumps({"id": b.task_info("eval", 3).task_id, "prompt": ep.first_turn().prompt,
                  "spec": b.spec(), "heavy": heavy}))
"""


@pytest.mark.parametrize("name,options", [("gridsim", {"prompt_style": "compact"}), ("arith", {})])
def test_spec_rebuilds_in_a_bare_stdlib_process(name: str, options: dict):
    """`python -S`: no site-packages, just the standard library and the agentrl folder, like the container."""
    bundle = load_bundle(name, **options)
    spec = bundle.spec()
    out = subprocess.run([sys.executable, "-S", "-c", _CHILD, str(REPO), json.dumps(spec)],
                         capture_output=True, text=True, timeout=600, check=True)
    child = json.loads(out.stdout)
    assert child["heavy"] == []
    assert child["spec"] == spec
    assert child["id"] == bundle.task_info("eval", 3).task_id
    assert child["prompt"] == bundle.episode("eval", 3).first_turn().prompt


def test_bundles_declare_their_teachers_eval_breakdown_and_data_options(tmp_path: Path):
    grid = load_bundle("gridsim", prompt_style="compact")
    assert grid.teachers == ("optimal", "greedy") and grid.eval_breakdown == {"duration_h": "reward_{}h"}
    assert grid.data_options() == {"prompt_style": "compact"}
    for teacher in grid.teachers:  # every declared teacher plays
        assert grid.demonstration("train", 0, teacher)[-1]["role"] == "tool"
    arith = load_bundle("arith")
    assert arith.teachers == ("optimal", "label") and arith.eval_breakdown == {} and arith.data_options() == {}
    for teacher in arith.teachers:
        assert arith.demonstration("train", 0, teacher)[-1]["role"] == "assistant"
    data = tmp_path / "mine.jsonl"
    data.write_text('{"q": "1+1?", "a": "2"}\n')
    mine = load_bundle("arith", data_file=str(data), prompt_key="q", label_key="a")
    assert mine.data_options() == {"data_file": str(data.resolve()), "prompt_key": "q", "label_key": "a"}
