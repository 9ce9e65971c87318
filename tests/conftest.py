"""Shared fixtures: isolate every test's outputs and MLflow store from the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.testing.mlflow_store import seed_store

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def agentrl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run output (and MLflow's SQLite store) under a temporary root."""
    home = tmp_path / "home"
    monkeypatch.setenv("AGENTRL_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture
def seeded_store(agentrl_home: Path) -> str:
    """A copy of an empty MLflow store where runs under `agentrl_home` open theirs (agentrl/testing/mlflow_store.py),
    for tests of what a run logs rather than of where or how a new store is made; returns its URI."""
    return seed_store(agentrl_home / "outputs" / "mlflow.db")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """In CI (AGENTRL_REQUIRE_DOCKER=1) a Docker test that skips is a failure: they must run for real."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("docker") and os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"Docker test skipped although AGENTRL_REQUIRE_DOCKER=1: {reason}"
