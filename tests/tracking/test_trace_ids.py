"""Episode traces of two runs with the same seed keep ids of their own (a seeded global `random` made them equal,
and the later run took the earlier run's traces over in the store)."""

from __future__ import annotations

import subprocess
import sys

# A fresh process: MLflow picks its trace id generator once, when its tracer is first made.
SCRIPT = """
import random, sys
from mlflow import MlflowClient
from agentrl.tracking.trace_record import EpisodeTrace, TracedRole
from agentrl.tracking.traces import log_episode

uri = sys.argv[1]
client = MlflowClient(tracking_uri=uri)
experiment = client.create_experiment("ids")
ids = []
for run in range(2):
    random.seed(0)  # what a run with seed=0 does before it plays (trainers/grpo/trainer.py)
    trace = EpisodeTrace(name="episode", task={"split": "eval", "index": 0},
                         roles=[TracedRole(role="agent", turns=[], outcome={"score": 1.0})], tags={"step": "0"})
    ids.append(log_episode(client, trace, experiment_id=experiment, run_id=None))
print(" ".join(ids))
"""


def test_two_runs_seeded_alike_write_different_trace_ids(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "-c", SCRIPT, uri], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.split()[-2:]
    assert first.startswith("tr-") and second.startswith("tr-")
    assert first != second
