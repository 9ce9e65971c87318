"""What a test's fresh home costs a CLI run, made from scratch vs seeded from copies built once per session
(agentrl/testing/mlflow_store.py, agentrl/testing/tiny_models.py), alternating, in one process.

- store: MLflow builds a new SQLite store by replaying its migrations; a seeded copy is only opened.
- model: the tiny model of the tests' shape (corpus, tokenizer, weights) built vs copied.

    python benchmarks/micro/bench_test_homes.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

from agentrl.models.tiny import ensure_tiny_model
from agentrl.testing.mlflow_store import empty_store, seed_store
from agentrl.testing.tiny_models import seed_tiny_model

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
        "model.intermediate_size=64", "model.vocab_size=1024"]  # tests/trainers' tiny shape


def _open(uri: str) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    root = Path(tempfile.mkdtemp(prefix="bench-test-homes-"))
    _open(f"sqlite:///{root / 'warm.db'}")  # imports and the first engine: neither side pays them
    empty_store()
    seed_tiny_model(TINY, root / "warm" / "models")
    times: dict[str, list[float]] = {"store new": [], "store seeded": [], "model built": [], "model seeded": []}
    for i in range(args.rounds):
        started = time.perf_counter()
        _open(f"sqlite:///{root / f'new{i}.db'}")
        times["store new"].append(time.perf_counter() - started)
        started = time.perf_counter()
        _open(seed_store(root / f"seeded{i}.db"))
        times["store seeded"].append(time.perf_counter() - started)
        started = time.perf_counter()
        ensure_tiny_model(str(root / f"built{i}" / "tiny"), hidden_size=32, num_layers=1, num_heads=2,
                          num_kv_heads=1, intermediate_size=64, vocab_size=1024)
        times["model built"].append(time.perf_counter() - started)
        started = time.perf_counter()
        seed_tiny_model(TINY, root / f"seeded{i}" / "models")
        times["model seeded"].append(time.perf_counter() - started)
    med = {k: statistics.median(v) for k, v in times.items()}
    for key, values in times.items():
        print(f"{key:13s} median {med[key]:7.3f} s  ({', '.join(f'{v:.3f}' for v in values)})")
    print(f"store: new/seeded = {med['store new'] / med['store seeded']:.0f}x, "
          f"{med['store new'] - med['store seeded']:.1f} s saved a store")
    print(f"model: built/seeded = {med['model built'] / med['model seeded']:.0f}x, "
          f"{med['model built'] - med['model seeded']:.1f} s saved a run")


if __name__ == "__main__":
    main()
