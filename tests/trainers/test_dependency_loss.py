"""A GRPO run through the real CLI whose env server (its own process, `env.server.url`) dies mid-run: killed with
-9 or frozen with SIGSTOP, the run (`trainer=grpo`, and `trainer=trl` killed) stops within `trainer.dependency_grace_s` (plus generous slack for a loaded
box) with one line naming the env server's URL; with `trainer.on_dependency_loss=wait` it waits for the server to
come back and finishes, no rollout of any step flagged for the outage.

Before the circuit breaker the killed server's run went on for half an hour (every rollout waited out its own
connect_timeout, and the stop rule counted 200 dropped groups), and the frozen one's resets each waited the full
600 s reset_timeout."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from env_server_runs import REPO, TINY, episodes_opened, start_env_server

from agentrl.testing.cli import cli_env
from agentrl.testing.ports import free_port

GRACE_S = 20
SLACK_S = 120  # a loaded 2-core box: starting the probe, cancelling the plays, closing the services and MLflow
TINY = [*TINY, f"trainer.dependency_grace_s={GRACE_S}"]


class Run:
    """`python -m agentrl ...` with its output read line by line as it comes (stdout and stderr together)."""

    def __init__(self, args: list[str], home: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl", *args], cwd=REPO, env=cli_env(home, args),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, deadline: float) -> None:
        while text not in self.out:
            assert self.proc.poll() is None, f"the run ended before {text!r}:\n{self.out[-4000:]}"
            assert time.monotonic() < deadline, f"never saw {text!r}:\n{self.out[-4000:]}"
            time.sleep(0.2)

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(30)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_for_rollouts(run: Run, log: Path) -> None:
    """Until step 1's rollouts reach the env server (step 0's eval opens one episode)."""
    deadline = time.monotonic() + 1200
    while episodes_opened(log) < 2:
        assert run.proc.poll() is None, run.out[-4000:]
        assert time.monotonic() < deadline, "the run never reached its rollouts"
        time.sleep(0.02)


def stop_line(run: Run) -> str:
    lines = [line for line in run.out.splitlines() if line.startswith("agentrl: ")]
    assert len(lines) == 1, run.out[-4000:]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(("trainer", "fault"), [("grpo", "killed"), ("grpo", "frozen"), ("trl", "killed")])
def test_a_run_stops_within_the_grace_window_naming_the_env_server(tmp_path: Path, trainer: str, fault: str) -> None:
    log, port = tmp_path / "env.log", free_port()
    server = start_env_server(port, log)
    run = Run([*TINY, f"trainer={trainer}", "trainer.steps=200", f"env.server.url=http://127.0.0.1:{port}"],
              tmp_path / "home")
    try:
        wait_for_rollouts(run, log)
        server.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        hit = time.monotonic()
        code = run.finish(timeout=GRACE_S + SLACK_S + 600)  # a hang net; the bound is asserted below
        took = time.monotonic() - hit
    finally:
        run.kill()
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait(60)
    assert code != 0, run.out[-4000:]
    line = stop_line(run)
    assert f"the env server at http://127.0.0.1:{port} stopped answering" in line, line
    assert "/health" in line and f"dependency_grace_s={GRACE_S}" in line, line
    if fault == "frozen":
        assert "did not answer within" in line, line  # frozen, not "full, or restarting"
    assert "Traceback" not in run.out, run.out[-4000:]
    assert "== agentrl run FAILED" in run.out
    # The console named it when it happened, before the stop.
    assert run.out.index("env server at http://127.0.0.1:") < run.out.index(line)
    assert took < GRACE_S + SLACK_S, f"{took:.0f}s from the {fault} server to the run's end"


@pytest.mark.slow
def test_grpo_run_waits_for_its_env_server_and_loses_no_rollout(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    home, log, port, steps = tmp_path / "home", tmp_path / "env.log", free_port(), 3
    server = start_env_server(port, log)
    run = Run([*TINY, f"trainer.steps={steps}", "trainer.on_dependency_loss=wait",
               f"env.server.url=http://127.0.0.1:{port}"], home)
    try:
        wait_for_rollouts(run, log)
        server.send_signal(signal.SIGKILL)
        server.wait()
        run.wait_for("waiting for its /health to answer", time.monotonic() + GRACE_S + SLACK_S)
        server = start_env_server(port, log)
        code = run.finish(timeout=1500)
    finally:
        run.kill()
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    assert code == 0, run.out[-4000:]
    assert "answers again" in run.out and "== agentrl run FINISHED" in run.out
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    (mlrun,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = {m.step for m in client.get_metric_history(mlrun.info.run_id, "train/reward")}
    assert history == set(range(1, steps + 1)), "every step ran"
    # The plays the outage cut were replayed, not dropped: no step kept a rollout flagged for it (the tiny model's
    # own failures, e.g. truncated replies, still drop groups as usual).
    for key in ("rollout/flagged/env_unreachable", "rollout/flagged/env_gone", "rollout/flagged/deploy"):
        values = [m.value for m in client.get_metric_history(mlrun.info.run_id, key)]
        assert not any(values), (key, values)
