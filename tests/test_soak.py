"""The fault soak (`benchmarks/studies/soak.py`) at a few dozen episodes: real env servers (killed with -9 and restarted
on the same port), real Docker containers killed under live episodes, the real agent; no episode hangs, no
unaffected episode is lost, no container is left behind. Sizes only: nothing here checks a duration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The tiny model's smallest shape (as tests/trainers' TINY): only the session server's path is under test.
TINY_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
              "model.intermediate_size=64", "model.vocab_size=1024"]


def soak(tmp_path: Path, *args: str) -> list[dict]:
    """Run the soak as a user would; returns its per-pass figures."""
    out = tmp_path / "soak.json"
    env = {**os.environ, "AGENTRL_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "benchmarks/studies/soak.py", "--logs", str(tmp_path / "logs"), "--json", str(out),
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-5000:]
    reports = json.loads(out.read_text())
    for r in reports:
        assert r["hung"] == 0, done.stdout
        assert r["lost"] == [], done.stdout
        assert r["left_behind"] == 0, done.stdout
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return reports


def docker_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
def test_local_soak_with_code_faults_and_a_server_kill(tmp_path: Path) -> None:
    """Episodes that raise on deploy and on a call, a call past its deadline, the env server killed mid-run."""
    (r,) = soak(tmp_path, "--sandboxes", "local", "--model", "scripted", "--episodes", "32", "--concurrency", "6",
                "--fault-every", "8", "--kill-at", "0.5", "--tool-timeout", "1", "--down-s", "1")
    assert r["episodes"] == 32 and r["scored"] > 0
    # The faults scheduled before the kill fired as what they are.
    assert r["flagged"].get("deploy", 0) >= 1 and r["flagged"].get("env_error", 0) >= 1
    assert r["restart_healthy_s"] is not None, "the server was never restarted"


@pytest.mark.slow
@pytest.mark.docker
def test_docker_soak_with_container_and_server_kills(tmp_path: Path) -> None:
    """Containers killed under live episodes and the server killed with -9: the restarted server (same port)
    reaps what its predecessor left, and nothing stays behind."""
    if not docker_answers():
        pytest.skip("no Docker daemon answers (bash .ci/setup_docker.sh)")
    (r,) = soak(tmp_path, "--sandboxes", "docker", "--model", "scripted", "--docker-episodes", "24",
                "--concurrency", "6", "--container-kills", "3", "--kill-at", "0.5", "--down-s", "1")
    assert r["episodes"] == 24 and r["scored"] > 0
    assert r["container_kills"] >= 1


@pytest.mark.slow
def test_soak_through_the_real_session_server(tmp_path: Path) -> None:
    """The same logic with the tiny model behind `python -m agentrl.inference.serve` (untrained: its replies
    are cut at max tokens, flagged as the model's doing, never as a loss)."""
    (r,) = soak(tmp_path, "--sandboxes", "local", "--model", "tiny", *[f"--model-override={o}" for o in TINY_MODEL],
                "--episodes", "12", "--concurrency", "4", "--fault-every", "0", "--kill-at", "0.5",
                "--max-response-tokens", "8", "--down-s", "1")
    assert r["episodes"] == 12 and sum(r["flagged"].values()) + r["scored"] == 12
