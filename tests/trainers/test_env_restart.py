"""A GRPO run through the real CLI against an env server run as its own process (`env.server.url`):
killed with -9 and restarted on the same port mid-run, the run goes on (the rollouts it cut are flagged, their
groups dropped and refilled) and finishes every step; gone for good, the run stops with one clear line naming
`env_unreachable` and the URL instead of running on."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from env_server_runs import REPO, TINY, episodes_opened, start_env_server

from agentrl.testing.cli import cli_env, run_agentrl
from agentrl.testing.ports import free_port

STEPS = 8


def _metric(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


@pytest.mark.slow
def test_grpo_run_goes_on_through_an_env_server_restart(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    home, log, port = tmp_path / "home", tmp_path / "env.log", free_port()
    server = start_env_server(port, log)
    run = subprocess.Popen([sys.executable, "-m", "agentrl", *TINY, f"trainer.steps={STEPS}", "trainer.max_extra_rows=2",
                            f"env.server.url=http://127.0.0.1:{port}", "env.server.connect_timeout=3"],
                           cwd=REPO, env=cli_env(home, TINY), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    try:
        # Step 0's eval opens one episode; kill the server (-9) as step 1's rollouts start.
        deadline = time.monotonic() + 1200
        while episodes_opened(log) < 2:
            assert run.poll() is None, run.stdout.read()[-4000:] if run.stdout else ""
            assert time.monotonic() < deadline, "the run never reached its rollouts"
            time.sleep(0.02)
        server.send_signal(signal.SIGKILL)
        server.wait()
        # The kill lands as step 1's first episode connects (its reset is simply retried later), so the cut shows as
        # rollouts that find nobody listening: stay down until a step has logged them (env_unreachable after
        # connect_timeout), then come back on the same port (the rows name it).
        flagged: dict[int, float] = {}
        while not flagged:
            assert run.poll() is None, "the run ended while its env server was down"
            assert time.monotonic() < deadline, "no step logged a rollout flagged env_unreachable"
            time.sleep(0.5)
            try:
                runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
                flagged = _metric(client, runs[0].info.run_id, "rollout/flagged/env_unreachable") if runs else {}
            except Exception:  # noqa: BLE001 - the run writes the same SQLite store: read it again next time
                flagged = {}
        server = start_env_server(port, log)
        out, _ = run.communicate(timeout=1500)
    finally:
        if run.poll() is None:
            run.kill()
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    assert run.returncode == 0, out[-4000:]
    assert "== agentrl run FINISHED" in out
    (mlrun,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    run_id = mlrun.info.run_id
    assert mlrun.info.status == "FINISHED"
    assert sorted(_metric(client, run_id, "train/reward")) == list(range(1, STEPS + 1)), "every step ran"
    # The cut rollouts' groups were dropped as failed and new rows drawn in their place ...
    cut = min(step for step, v in _metric(client, run_id, "rollout/flagged/env_unreachable").items() if v > 0)
    assert _metric(client, run_id, "rollout/groups_dropped/failed")[cut] > 0
    assert _metric(client, run_id, "rollout/rows_drawn")[cut] > 2
    # ... and once the server was back, the last step's rollouts all reached it.
    for key in ("rollout/flagged/env_unreachable", "rollout/flagged/env_gone"):
        assert _metric(client, run_id, key).get(STEPS, 0.0) == 0.0, key


@pytest.mark.slow
def test_grpo_run_stops_when_the_env_server_is_gone_for_good(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    url = f"http://{address}"
    done = run_agentrl([*TINY, "trainer.steps=5", "trainer.max_extra_rows=2", "trainer.max_drops_in_a_row=2",
                        f"env.server.url={url}", "env.server.connect_timeout=2"], tmp_path / "home", timeout=1200,
                       check=False).process
    assert done.returncode != 0
    # One line for the user, not a traceback: which failure and where.
    lines = [line for line in done.stderr.splitlines() if line.startswith("agentrl: ")]
    assert len(lines) == 1, done.stderr[-4000:]
    assert "env_unreachable" in lines[0] and address in lines[0], lines[0]  # the URL as the client dialled it
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    assert "== agentrl run FAILED" in done.stdout
