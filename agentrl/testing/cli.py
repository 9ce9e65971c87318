"""Run the real CLI (`python -m agentrl ...`) the way the suite's end-to-end tests do: in a fresh home of its own,
against a copied empty MLflow store, with the tiny model the arguments describe copied in, one torch thread.

`run_agentrl` returns a `CliRun`: the completed process, and the run folder and MLflow run the process printed.
`cli_env` is that run's environment, for a test that starts the process itself (`subprocess.Popen`, to kill it);
`run_cli` runs `python -m agentrl` (or another module) with no home of its own, as a user at a shell would.
In every `env` given here a value of None removes that variable.
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

from agentrl.testing.mlflow_store import seed_store as copy_empty_store
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


def run_cli(args: Sequence[str], *, cwd: Path = REPO, env: Mapping[str, str | None] | None = None,
            timeout: float = 1200, python: str = sys.executable, module: str = "agentrl",
            check: bool = False) -> subprocess.CompletedProcess:
    """Run `python -m <module> ARGS` in a subprocess, as a user would: this process's environment plus `env`,
    its output captured as text. `check` raises CalledProcessError on a nonzero exit status."""
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run([python, "-m", module, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, check=check)


def cli_env(home: Path, args: Sequence[str] = (), *, env: Mapping[str, str | None] | None = None,
            seed_model: bool = True, seed_store: bool = True) -> dict[str, str]:
    """The environment of a test's `python -m agentrl ARGS` run in `home`: this process's, with `AGENTRL_HOME=home`,
    the store at `home/mlflow.db` (a copied empty one; `seed_store=False` leaves the run to build its own there),
    `QUIET_ENV` and then `env`. `seed_model` copies in the tiny model `args` describe (`seed_tiny_model`)."""
    if seed_model:
        seed_tiny_model(list(args), home / "outputs" / "models")
    uri = copy_empty_store(home / "mlflow.db") if seed_store else f"sqlite:///{home / 'mlflow.db'}"
    full_env = {**os.environ, "AGENTRL_HOME": str(home), "MLFLOW_TRACKING_URI": uri, **QUIET_ENV, **(env or {})}
    return {k: v for k, v in full_env.items() if v is not None}


def run_agentrl(args: Sequence[str], home: Path, *, env: Mapping[str, str | None] | None = None,
                timeout: float = 1500, seed_model: bool = True, seed_store: bool = True, check: bool = True,
                module: str = "agentrl") -> CliRun:
    """Run `python -m <module> <args>` from the checkout in `cli_env(home, args, ...)`: its own home, a copied empty
    store at `home/mlflow.db` (`seed_store=False`: the run builds it), the tiny model copied in (`seed_model=False`
    leaves it for the run to build).

    `env` adds to (or overrides, or with None removes from) the process's environment; `check` asserts a zero exit
    status, showing the end of stderr when it is not."""
    full_env = cli_env(home, args, env=env, seed_model=seed_model, seed_store=seed_store)
    removed = {k: None for k in os.environ if k not in full_env}  # what `env` took out stays out
    done = run_cli(args, env={**full_env, **removed}, timeout=timeout, module=module)
    if check:
        assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-4000:]}"
    return CliRun(done, home, full_env["MLFLOW_TRACKING_URI"])
