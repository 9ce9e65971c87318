"""Ctrl-C on `python -m agentrl`, as a user presses it: no traceback, exit 130, the MLflow run closed as KILLED, and
a closing block whose `resume it` line is a command that resumes (or, before any checkpoint, `rerun it`). SIGTERM
(`kill`, `docker stop`, a scheduler) ends a run the same way, with exit 143."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from agentrl.testing.cli import cli_env

REPO = Path(__file__).resolve().parents[1]
# arith on an untrained 1-layer model, every group trained and checkpointed each step: steps of a fraction of a second.
TINY = ["env=arith", "agent=tool_calling", "reward=env_score", "agent.max_turns=2", "agent.max_response_tokens=8",
        "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=2", "trainer.eval_every=0",
        "trainer.checkpoint_every=1", "trainer.max_extra_rows=0", "trainer.drop_no_signal=false",
        "trainer.model_failures=penalize", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024"]


def _interrupt_when(home: Path, args: list[str], ready, sig: int = signal.SIGINT) -> subprocess.CompletedProcess:
    """Run the CLI, press Ctrl-C (SIGINT; or send `sig`) once `ready()` holds, and return how it ended."""
    out, err = home.parent / "stdout.txt", home.parent / "stderr.txt"  # files: a full pipe would stall the run
    with out.open("w") as stdout, err.open("w") as stderr:
        # SIGINT as a terminal sends it, even where this test runs in a background job (which ignores SIGINT).
        proc = subprocess.Popen([sys.executable, "-m", "agentrl", *args], cwd=REPO, env=cli_env(home, args),
                                stdout=stdout, stderr=stderr,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 1200
        while not ready():
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never reached the point to interrupt"
            time.sleep(0.1)
        proc.send_signal(sig)
        proc.wait(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())


def _stopped_by_ctrl_c(returncode: int) -> bool:
    """Exit 130, or death by SIGINT: a shell reads both as status 130. CI once saw the second (Ctrl-C in the warm
    start, the message and the closing block complete): CPython can end a process that a KeyboardInterrupt went
    through by SIGINT on its way out, whatever `SystemExit` followed; where it did here was not traced."""
    return returncode in (130, -signal.SIGINT)


def _only_run(home: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    return runs[0]


def _home(home: Path) -> str:
    """What a printed command starts with when the run had AGENTRL_HOME=home (every run here has)."""
    return f"AGENTRL_HOME={shlex.quote(str(home.resolve()))} "


def _stopped_mid_training(tmp_path: Path, sig: int, exited, name: str, args: list[str] | None = None,
                          checkpoint: str = "*/*/step-*/state.pt"):
    """A 400-step run (`args`; GRPO on arith by default) stopped by `sig` once it has a checkpoint (`checkpoint`
    under outputs/checkpoints): no traceback, `exited(returncode)`, the line saying it stops at the end of the
    step, "stopped by `name`", the MLflow run closed as KILLED. Returns (home, args, the run, its `resume it` line)."""
    home = tmp_path / "home"
    args = args or [*TINY, "trainer.warm_start.enabled=false", "trainer.steps=400"]
    ckpts = home / "outputs" / "checkpoints"
    stopped = _interrupt_when(home, args, lambda: any(ckpts.glob(checkpoint)), sig=sig)
    assert exited(stopped.returncode), (stopped.returncode, stopped.stderr[-3000:])
    assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert f"agentrl: {name}: stopping at the end of this step" in stopped.stderr  # agentrl/interrupts.py
    assert f"agentrl: stopped by {name}" in stopped.stderr
    assert "== agentrl run KILLED" in stopped.stdout
    run = _only_run(home)
    assert run.info.status == "KILLED"
    return home, args, run, next(ln for ln in stopped.stdout.splitlines() if ln.startswith("resume it"))


@pytest.mark.slow
def test_ctrl_c_mid_training_prints_a_resume_command_that_resumes(tmp_path: Path) -> None:
    home, args, run, line = _stopped_mid_training(tmp_path, signal.SIGINT, _stopped_by_ctrl_c, "Ctrl-C")
    ckpts = home / "outputs" / "checkpoints"
    command, _, note = line.removeprefix("resume it").strip().partition("  (from step ")
    assert command == _home(home) + shlex.join(["python", "-m", "agentrl", *args, f"trainer.resume={run.info.run_id}"])
    step = int(note.rstrip(")"))
    assert any(ckpts.glob(f"*/{run.info.run_id}/step-{step:06d}/state.pt")), "the step it names was checkpointed"
    # The printed command, pasted into another shell that has no AGENTRL_HOME (one step past the checkpoint, not
    # 400), continues the same run from that step: the command carries the home its checkpoints are under.
    pasted = command.replace("trainer.steps=400", f"trainer.steps={step + 1}").replace(
        "python -m", f"{shlex.quote(sys.executable)} -m", 1)
    env = cli_env(home, shlex.split(command)[4:], env={"AGENTRL_HOME": None})
    done = subprocess.run(["bash", "-c", pasted], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"at step {step + 1}" in done.stdout
    assert _only_run(home).info.status == "FINISHED"


@pytest.mark.slow
def test_ctrl_c_in_the_warm_start_says_to_run_it_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # A warm start far longer than the test: Ctrl-C lands in the SFT, before any GRPO checkpoint.
    args = [*TINY, "trainer.steps=2", "trainer.warm_start.steps=100000", "trainer.warm_start.batch_samples=2"]
    log = home / "outputs" / "runs"
    stopped = _interrupt_when(home, args, lambda: any("SFT" in p.read_text() for p in log.glob("**/*.log")))
    assert _stopped_by_ctrl_c(stopped.returncode), (stopped.returncode, stopped.stderr[-3000:])
    assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    run = _only_run(home)
    assert run.info.status == "KILLED"
    kept = re.search(r"SFT stopped after step (\d+)/100000", stopped.stdout)  # none when it stopped at step 0
    note = f"; its SFT continues from step {kept.group(1)}" if kept else ""
    assert (f"rerun it      {_home(home)}{shlex.join(['python', '-m', 'agentrl', *args])}  "
            f"(it stopped before its first checkpoint{note})") in stopped.stdout
    assert not list((home / "outputs" / "checkpoints").glob("*/*/step-*"))


@pytest.mark.slow
def test_sigterm_mid_training_closes_the_run_as_ctrl_c_does(tmp_path: Path) -> None:
    _, args, run, line = _stopped_mid_training(tmp_path, signal.SIGTERM, lambda rc: rc == 143, "SIGTERM")
    assert line.startswith("resume it     " + _home(tmp_path / "home") + shlex.join(
        ["python", "-m", "agentrl", *args, f"trainer.resume={run.info.run_id}"]) + "  (from step ")


@pytest.mark.slow
def test_ctrl_c_under_trl_stops_between_steps(tmp_path: Path) -> None:
    # trainer=trl in this process: the signal waits for the next step's start (the callback's stop point).
    args = ["+recipe=gridsim_grpo", "trainer=trl", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
            "trainer.eval_limit=2", "trainer.eval_every=0", "trainer.checkpoint_every=1",
            "trainer.warm_start.enabled=false", "trainer.steps=400", "agent.max_response_tokens=8",
            *TINY[TINY.index("model.hidden_size=32"):]]
    _, _, run, line = _stopped_mid_training(tmp_path, signal.SIGINT, _stopped_by_ctrl_c, "Ctrl-C", args=args,
                                            checkpoint="**/checkpoint-*")
    assert line.startswith("resume it     " + _home(tmp_path / "home") + shlex.join(
        ["python", "-m", "agentrl", *args, f"trainer.resume={run.info.run_id}"]) + "  (from step ")
