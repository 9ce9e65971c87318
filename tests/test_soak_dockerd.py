"""The fault soak's "dockerd frozen" phase (`benchmarks/studies/soak_dockerd.py`) at CI size: the real Docker engine behind
a relay that freezes; every reset started while it is frozen fails naming the daemon, the server deploys again
once it thaws, and nothing is left behind. Outcomes only: the phase's durations are its figures, not checked here
beyond "the reset did not wait for reset_timeout"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def docker_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.docker
def test_dockerd_frozen_phase(tmp_path: Path) -> None:
    if not docker_answers():
        if os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":
            pytest.fail("AGENTRL_REQUIRE_DOCKER=1 but no Docker daemon answers")
        pytest.skip("no Docker daemon answers (bash .ci/setup_docker.sh)")
    out = tmp_path / "frozen.json"
    env = {**os.environ, "AGENTRL_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/studies/soak_dockerd.py", "--resets", "3", "--docker-timeout", "5",
                           "--logs", str(tmp_path / "logs"), "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-5000:]
    r = json.loads(out.read_text())
    assert r["named"] == 3 and r["other"] == [] and r["left_behind"] == 0, r
    assert "sandbox.docker_timeout" in r["example"], r["example"]
    # Each failed on the Docker timeout, long before the 600 s reset_timeout (the old wait was 240 s).
    assert len(r["fail_s"]) == 3 and max(r["fail_s"]) < 5 + 120, r["fail_s"]
    assert r["health_503_s"] is not None and r["thaw_scored_s"] is not None, r
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
