"""An empty MLflow SQLite store, built once per process and copied to where a test's run will open its store.

MLflow builds a new SQLite store by replaying its whole migration history: 4-14 s a store on a 2-core box, and
the suite opens dozens. A copy of one built earlier opens in a fraction of a second and is the same store: the
tables at the same schema revision, no experiment (the default experiment is left out of the copy, so the
process that opens it makes its own, as it does in a new store). Tests about where a new store is made leave
it out and let MLflow build theirs.
"""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

_lock = threading.Lock()
_template: Path | None = None


def _build_template() -> Path:
    from mlflow.tracking import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="agentrl-test-mlflow-store-"))
    atexit.register(shutil.rmtree, folder, True)
    db = folder / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # builds the tables (all migrations)
    with sqlite3.connect(db) as con:
        # Experiment 0's artifact location names the folder it was made in: the opener makes its own.
        con.execute("DELETE FROM experiments WHERE experiment_id = 0")
    con.close()
    return db


def empty_store() -> Path:
    """The process's empty, migrated store (built on first use; removed when the process exits)."""
    global _template
    with _lock:
        if _template is None:
            _template = _build_template()
        return _template


def seed_store(db: str | Path) -> str:
    """Put a copy of the empty store at `db` (its folders made) unless a file is there; returns its
    `sqlite:///` URI."""
    db = Path(db)
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(empty_store(), db)
    return f"sqlite:///{db}"
