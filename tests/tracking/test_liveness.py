"""A run killed without closing its MLflow run is found and closed by the next start (real SQLite store)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from agentrl.run import closing_block
from agentrl.testing.mlflow_store import seed_store
from agentrl.tracking.liveness import (
    FOUND_DEAD_TAG,
    HEARTBEAT_TAG,
    HOST_TAG,
    PID_NS_TAG,
    PID_TAG,
    PROCESS_START_TAG,
    process_start,
    process_tags,
)
from agentrl.tracking.mlflow_tracker import MLflowTracker

# A run as `python -m agentrl` opens it, then kept alive (or killed) by the test.
_RUN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from omegaconf import OmegaConf
    from agentrl.tracking.mlflow_tracker import MLflowTracker
    cfg = OmegaConf.create({"dry_run": False, "task_name": "gridsim_grpo", "seed": 0})
    tracker = MLflowTracker(tracking_uri=sys.argv[1], experiment="t", output_root=sys.argv[2], heartbeat_s=3600)
    tracker.start(cfg, choices={"recipe": "gridsim_grpo"}, run_dir=Path(sys.argv[2]) / "run",
                  overrides=["+recipe=gridsim_grpo", "trainer.steps=5"])
    print(tracker.run_id, flush=True)
    time.sleep(3600)
""")


def _cfg(task: str = "gridsim_grpo"):
    return OmegaConf.create({"dry_run": False, "task_name": task, "seed": 0})


def _open_run_in_a_process(uri: str, tmp_path: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _RUN, uri, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    run_id = proc.stdout.readline().strip()
    assert run_id, "the run's process printed no run id"
    return proc, run_id


def test_a_run_killed_with_kill_9_is_marked_killed_on_the_next_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    uri = seed_store(tmp_path / "mlflow.db")
    killed, killed_id = _open_run_in_a_process(uri, tmp_path)
    alive, alive_id = _open_run_in_a_process(uri, tmp_path)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        client = MlflowClient(uri)
        assert client.get_run(killed_id).info.status == "RUNNING"  # what a kill -9 leaves behind

        tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
        tracker.start(_cfg(), choices={"recipe": "gridsim_grpo"}, run_dir=tmp_path / "next")
        dead = client.get_run(killed_id)
        assert dead.info.status == "KILLED"
        assert f"process {killed.pid} on host {socket.gethostname()} is gone" in dead.data.tags[FOUND_DEAD_TAG]
        assert f"by run {tracker.run_id}" in dead.data.tags[FOUND_DEAD_TAG]
        assert dead.info.end_time == int(dead.data.tags[HEARTBEAT_TAG]) * 1000  # it ended at its last beat
        assert client.get_run(alive_id).info.status == "RUNNING"  # a live process's run is left alone
        assert [d.run_id for d in tracker.dead_runs] == [killed_id]

        # The new run's closing block says so, and how to continue the dead one with its own overrides.
        monkeypatch.delenv("AGENTRL_HOME", raising=False)  # set, it would lead the command (test_closing_blocks.py)
        block = closing_block(status="FINISHED", run_dir=tmp_path / "next", tracker=tracker, metrics={}, wall_s=1)
        lines = block.splitlines()
        assert any(ln.startswith(f"found dead    earlier run {killed_id} (gridsim_grpo steps=5 seed=0)")
                   and "marked KILLED" in ln for ln in lines), block
        resume = next(ln for ln in lines if ln.startswith("resume it"))
        assert resume == ("resume it     python -m agentrl +recipe=gridsim_grpo trainer.steps=5 "
                          f"trainer.resume={killed_id}"), resume
        # A trainer that cannot resume is told to rerun instead.
        rerun = closing_block(status="FINISHED", run_dir=tmp_path, tracker=tracker, metrics={}, wall_s=1,
                              resumable=False)
        assert "rerun it      python -m agentrl +recipe=gridsim_grpo trainer.steps=5" in rerun
        assert "resume it" not in rerun
        tracker.finish()

        # A run of another task hears nothing about it (the dead run was closed once, by the first start).
        other = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
        other.start(_cfg("gridsim_sft"), choices={}, run_dir=tmp_path / "other")
        assert other.dead_runs == []
        other.finish()
    finally:
        alive.kill()
        alive.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_which_running_runs_count_as_dead(tmp_path: Path):
    """Same host: the process decides (a reused pid is told apart by its start); other hosts: the heartbeat."""
    uri = seed_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("t")
    host, now, me = socket.gethostname(), int(time.time()), process_tags()
    assert me[PROCESS_START_TAG] == process_start(os.getpid())
    cases = {
        "reused pid": ({**me, PROCESS_START_TAG: "another-boot:1"}, "KILLED"),
        "this process": (me, "RUNNING"),
        "gone, fresh heartbeat": ({HOST_TAG: host, PID_TAG: str(_dead_pid()), HEARTBEAT_TAG: str(now)}, "KILLED"),
        "other host, stale": ({HOST_TAG: "elsewhere", PID_TAG: "1", HEARTBEAT_TAG: str(now - 1000)}, "KILLED"),
        "other host, fresh": ({HOST_TAG: "elsewhere", PID_TAG: "1", HEARTBEAT_TAG: str(now - 100)}, "RUNNING"),
        # A container on this host's network: the same hostname, its own pids; only its heartbeat can tell.
        "other pid namespace, fresh": ({HOST_TAG: host, PID_NS_TAG: "pid:[1]", PID_TAG: str(_dead_pid()),
                                        HEARTBEAT_TAG: str(now - 100)}, "RUNNING"),
        "no heartbeat (an older run)": ({}, "RUNNING"),
    }
    ids = {name: client.create_run(exp, run_name=name, tags=tags).info.run_id for name, (tags, _) in cases.items()}
    finished = client.create_run(exp, tags={HOST_TAG: host, PID_TAG: str(_dead_pid()), HEARTBEAT_TAG: str(now)})
    client.set_terminated(finished.info.run_id, "FINISHED")

    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path, stale_after_s=600)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    tracker.finish()
    statuses = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert statuses == {name: want for name, (_, want) in cases.items()}
    assert client.get_run(finished.info.run_id).info.status == "FINISHED"
    assert "no heartbeat from its process 1 on host elsewhere for 1" in \
        client.get_run(ids["other host, stale"]).data.tags[FOUND_DEAD_TAG]  # 16-17 min
    assert "(logger.stale_after_s=600)" in client.get_run(ids["other host, stale"]).data.tags[FOUND_DEAD_TAG]
    assert sorted(d.name for d in tracker.dead_runs) == sorted(n for n, (_, w) in cases.items() if w == "KILLED")


def test_a_resumed_run_is_not_closed_and_takes_over_the_process_tags(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    old = client.create_run(client.create_experiment("t"),
                            tags={HOST_TAG: socket.gethostname(), PID_TAG: str(_dead_pid()),
                                  HEARTBEAT_TAG: str(int(time.time())), FOUND_DEAD_TAG: "its process is gone"}
                            ).info.run_id
    client.set_terminated(old, "KILLED")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run", resume_run_id=old)
    run = client.get_run(old)
    assert run.info.status == "RUNNING" and tracker.dead_runs == []
    assert run.data.tags[PID_TAG] == str(os.getpid()) and FOUND_DEAD_TAG not in run.data.tags
    tracker.finish()


def test_the_heartbeat_beats_until_the_run_finishes(tmp_path: Path):
    uri = seed_store(tmp_path / "mlflow.db")
    tracker = MLflowTracker(tracking_uri=uri, experiment="t", output_root=tmp_path, heartbeat_s=0.2)
    tracker.start(_cfg(), choices={}, run_dir=tmp_path / "run")
    client = MlflowClient(uri)
    first = client.get_run(tracker.run_id).data.tags[HEARTBEAT_TAG]
    deadline = time.monotonic() + 120  # generous: a loaded box still beats many times in this
    while client.get_run(tracker.run_id).data.tags[HEARTBEAT_TAG] == first and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.get_run(tracker.run_id).data.tags[HEARTBEAT_TAG] != first
    heartbeat = tracker._heartbeat
    tracker.finish()
    assert heartbeat is not None and not heartbeat._thread.is_alive()


@pytest.mark.parametrize("key", ["heartbeat_s", "stale_after_s"])
def test_a_non_positive_interval_is_refused_naming_it(key: str, tmp_path: Path):
    with pytest.raises(ValueError, match=f"logger.{key} must be > 0"):
        MLflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", output_root=tmp_path, **{key: 0})


@pytest.mark.slow
@pytest.mark.usefixtures("seeded_store")
def test_a_killed_cli_run_is_named_by_the_next_runs_closing_block(agentrl_home: Path, tmp_path: Path):
    """As a user meets it: `python -m agentrl` killed with kill -9 mid-run, then the same task run again."""
    from agentrl.testing.cli import run_cli

    args = ["+recipe=gridsim_sft", "trainer.augment=0", "trainer.batch_samples=2", "trainer.eval_limit=2"]
    proc = subprocess.Popen([sys.executable, "-m", "agentrl", *args, "trainer.steps=100000"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        # The plan is printed once the MLflow run is open (reading the store earlier would race its creation).
        for line in proc.stdout:
            if line.startswith("metrics    MLflow"):
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and anything it started
        proc.wait()
    store = agentrl_home / "outputs" / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])
    assert [r.info.status for r in runs] == ["RUNNING"]
    killed = runs[0].info.run_id

    again = run_cli([*args, "trainer.steps=1"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert client.get_run(killed).info.status == "KILLED"
    assert f"found dead    earlier run {killed} (gridsim_sft " in again.stdout
    assert f"process {proc.pid} on host {socket.gethostname()} is gone" in again.stdout
    # The SFT trainer does not resume: the block gives the killed run's command to run again.
    home = shlex.quote(str(agentrl_home.resolve()))  # the command carries the project it ran in
    assert f"rerun it      AGENTRL_HOME={home} python -m agentrl +recipe=gridsim_sft trainer.augment=0" in again.stdout
    assert "trainer.steps=100000  (this trainer does not resume)" in again.stdout
