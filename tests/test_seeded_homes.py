"""The copies tests put in a run's home (agentrl/testing) are what the run would have made itself: an MLflow store
MLflow would have built, and the tiny model agentrl would have built, byte for byte."""

from __future__ import annotations

import filecmp
import sqlite3
from pathlib import Path

from mlflow.tracking import MlflowClient

from agentrl.models.tiny import ensure_tiny_model
from agentrl.testing.mlflow_store import empty_store, seed_store
from agentrl.testing.tiny_models import seed_tiny_model, tiny_model_folder

TINY = ["+recipe=gridsim_grpo", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024", "trainer.steps=2"]


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as con:
        (revision,) = con.execute("SELECT version_num FROM alembic_version").fetchone()
    con.close()
    return revision


def test_a_seeded_store_opens_as_the_store_mlflow_builds(tmp_path: Path, monkeypatch) -> None:
    empty_store()  # built elsewhere (here: in another working folder) ...
    monkeypatch.chdir(tmp_path)  # ... the default experiment's artifacts are ./mlruns of whoever opens the copy
    new, seeded = tmp_path / "new" / "mlflow.db", tmp_path / "seeded" / "mlflow.db"
    built = MlflowClient(f"sqlite:///{new}")
    copied = MlflowClient(seed_store(seeded))
    assert seed_store(seeded) == f"sqlite:///{seeded}"  # a store already there is kept
    assert _revision(seeded) == _revision(new)
    view = [[(e.experiment_id, e.name, e.artifact_location) for e in c.search_experiments()] for c in (built, copied)]
    assert view[0] == view[1] == [("0", "Default", (tmp_path / "mlruns" / "0").as_uri().removeprefix("file://"))]
    run = copied.create_run(copied.create_experiment("t"))
    copied.log_metric(run.info.run_id, "x", 1.0)
    assert copied.get_run(run.info.run_id).data.metrics == {"x": 1.0}


def test_a_seeded_tiny_model_is_the_folder_the_run_would_build(tmp_path: Path) -> None:
    seeded = seed_tiny_model(TINY, tmp_path / "home" / "outputs" / "models")
    assert seeded == tmp_path / "home" / "outputs" / "models" / "tiny-s0-h32-l1-v1024"  # model.path's pattern
    built = Path(ensure_tiny_model(str(tmp_path / "built"), hidden_size=32, num_layers=1, num_heads=2,
                                   num_kv_heads=1, intermediate_size=64, vocab_size=1024))
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in seeded.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(built, seeded, names, shallow=False)
    assert (mismatch, errors) == ([], []) and sorted(match) == names
    assert ensure_tiny_model(str(seeded), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, vocab_size=1024) == str(seeded)  # the run reuses it


def test_runs_that_set_no_tiny_shape_get_no_copy(tmp_path: Path) -> None:
    for args in (["+recipe=gridsim_quick"], [*TINY, "model=hf"], [*TINY, "model.path=/m"],
                 [*TINY, "paths.model_dir=/m"], ["-m", "model.hidden_size=32,64"]):
        assert tiny_model_folder(args, tmp_path) is None, args
        assert seed_tiny_model(args, tmp_path) is None
    assert list(tmp_path.iterdir()) == []
