"""Run the real CLI (`python -m agentrl ...`) the way the suite's end-to-end tests do: in a fresh home of its own,
against a copied empty MLflow store, with the tiny model the arguments describe copied in, one torch thread.

`run_agentrl` returns a `CliRun`: the completed process, and the run folder and MLflow run the process printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.testing.mlflow_store import seed_store
from agentrl.testing.tiny_models import seed_tiny_model

REPO = Path(__file__).resolve().parents[2]  # the checkout: the CLI runs from it, so its conf/ and recipes/ are used
# What every test's run sets: one torch thread each on a shared box, and neither library's fork/experiment notices.
QUIET_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}


@dataclass
class CliRun:
    """A finished `python -m agentrl` run: `process` (its exit status and output), `home` and the store's URI."""

    process: subprocess.CompletedProcess
    home: Path
    tracking_uri: str

    @property
    def stdout(self) -> str:
        return self.process.stdout

    def run_dir(self) -> Path:
        """The run folder the end-of-run block names (the last one, for a sweep)."""
        found = re.findall(r"^run folder\s+(\S+)", self.process.stdout, flags=re.MULTILINE)
        if not found:
            raise AssertionError(f"no run folder in the output:\n{self.process.stdout[-3000:]}")
        return Path(found[-1])

    def client(self) -> Any:
        """An `MlflowClient` on the run's store."""
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def mlflow_run(self) -> Any:
        """The MLflow run the end-of-run block names (the last one, for a sweep)."""
        found = re.findall(r"MLflow\s+\S+\s+experiment \S+\s+run (\w+)", self.process.stdout)
        if not found:
            raise AssertionError(f"no MLflow run in the output:\n{self.process.stdout[-3000:]}")
        return self.client().get_run(found[-1])


def run_agentrl(args: Sequence[str], home: Path, *, env: Mapping[str, str] | None = None, timeout: float = 1500,
                seed_model: bool = True, check: bool = True, module: str = "agentrl") -> CliRun:
    """Run `python -m <module> <args>` with `AGENTRL_HOME=home` and a copied empty store at `home/mlflow.db`.

    `env` adds to (or overrides) the process's environment; `seed_model=False` leaves the tiny model for the run
    to build; `check` asserts a zero exit status, showing the end of stderr when it is not."""
    if seed_model:
        seed_tiny_model(list(args), home / "outputs" / "models")
    uri = seed_store(home / "mlflow.db")
    full_env = {**os.environ, "AGENTRL_HOME": str(home), "MLFLOW_TRACKING_URI": uri, **QUIET_ENV, **(env or {})}
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-4000:]}"
    return CliRun(done, home, full_env["MLFLOW_TRACKING_URI"])
