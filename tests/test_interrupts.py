"""Ctrl-C and SIGTERM never land inside a write to the MLflow store (agentrl/interrupts.py).

Each case runs in a process of its own: the signals are real, sent by the process to itself, and pytest's own
SIGINT handling stays out of it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _sigint_default() -> None:
    """In the child, before Python starts: SIGINT as a terminal delivers it. A suite run as a background job (CI's
    script) starts its children with SIGINT ignored, and then Python installs no handler (test_ctrl_c does the same)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _python(script: str) -> subprocess.CompletedProcess:
    """`python -c script` in the repository, SIGINT at its default, output captured."""
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          preexec_fn=_sigint_default)


# A run's tracker gets the signal from SQLite's own cursor, just after the INSERT of its metrics and before their
# commit: raised there, the write would be rolled back (and could leave the store locked for the next one).
_MID_WRITE = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from omegaconf import OmegaConf
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from agentrl.interrupts import Terminated, install
    from agentrl.tracking.mlflow_tracker import MLflowTracker

    install()
    sig = getattr(signal, sys.argv[3])
    tracker = MLflowTracker(tracking_uri=sys.argv[1], experiment="t", output_root=sys.argv[2], heartbeat_s=3600)
    tracker.start(OmegaConf.create({"dry_run": False, "task_name": "t", "seed": 0}), choices={},
                  run_dir=Path(sys.argv[2]) / "run")
    sent = []

    @event.listens_for(Engine, "after_cursor_execute")
    def _signal_mid_write(conn, cursor, statement, *args):
        if not sent and statement.lstrip().upper().startswith("INSERT INTO METRICS"):
            sent.append(statement)
            os.kill(os.getpid(), sig)
            for _ in range(10_000):  # bytecodes: Python runs the handler at the first of them
                pass

    try:
        tracker.log({"a": 1.0, "b": 2.0}, step=0)
        print("not interrupted")
    except KeyboardInterrupt as err:
        print("interrupted:", type(err).__name__, "sent:", bool(sent))
    began = time.monotonic()
    tracker.finish("KILLED")
    print("closed in", round(time.monotonic() - began, 1))
    run = tracker.client.get_run(tracker.run_id)
    print("status", run.info.status, "metrics", sorted(run.data.metrics))
""")


@pytest.mark.parametrize(("sig", "raised"), [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
def test_a_signal_inside_a_store_write_is_raised_after_it_commits(tmp_path: Path, sig: str, raised: str) -> None:
    done = subprocess.run([sys.executable, "-c", _MID_WRITE, f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path),
                           sig], cwd=REPO, capture_output=True, text=True, timeout=600,
                          preexec_fn=_sigint_default)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert f"interrupted: {raised} sent: True" in lines, done.stdout
    # The whole batch was written before the interrupt was raised, and the store took the run's close at once
    # (a write left open would hold SQLite's lock: the close would wait out MLflow's 20 s busy timeout and fail).
    assert "status KILLED metrics ['a', 'b']" in lines, done.stdout
    closed = float(next(ln for ln in lines if ln.startswith("closed in")).split()[-1])
    assert closed < 15, done.stdout


_TWICE = textwrap.dedent("""
    import os, signal
    from agentrl.interrupts import held, install

    install()
    reached = []
    try:
        with held():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):
                pass
            reached.append("after the first")
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):
                pass
            reached.append("after the second")
    except KeyboardInterrupt:
        print("raised after", reached)
""")


def test_a_second_ctrl_c_inside_a_held_write_is_raised_at_once() -> None:
    done = subprocess.run([sys.executable, "-c", _TWICE], cwd=REPO, capture_output=True, text=True, timeout=300,
                          preexec_fn=_sigint_default)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "raised after ['after the first']"


def test_an_ignored_sigint_stays_ignored() -> None:
    # A background job (`cmd &` in a script) starts with SIGINT ignored: install() must not make it interruptible.
    script = ("import signal; from agentrl.interrupts import install; install(); "
              "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM).__name__)")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "_on_signal"]


_LOOP = textwrap.dedent("""
    import os, signal, sys
    from agentrl.interrupts import between_steps, held, install, stop_point

    install()
    done = []
    try:
        with between_steps():
            for step in range(3):
                stop_point()
                if step == 0:
                    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
                    for _ in range(10_000):
                        pass
                    with held():  # a store write inside the step: still raised at the loop's stop point
                        pass
                done.append(step)
    except KeyboardInterrupt as err:
        print(type(err).__name__, "after steps", done)
""")


@pytest.mark.parametrize(("sig", "raised", "line"), [
    ("SIGINT", "KeyboardInterrupt", "agentrl: Ctrl-C: stopping at the end of this step (press Ctrl-C again stops it now)"),
    ("SIGTERM", "Terminated", "agentrl: SIGTERM: stopping at the end of this step (a second SIGTERM stops it now)"),
])
def test_a_signal_inside_a_training_step_stops_the_loop_at_its_next_stop_point(sig: str, raised: str,
                                                                               line: str) -> None:
    done = subprocess.run([sys.executable, "-c", _LOOP, sig], cwd=REPO, capture_output=True, text=True, timeout=300,
                          preexec_fn=_sigint_default)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"{raised} after steps [0]"
    assert line in done.stderr.splitlines()


def test_a_signal_in_the_last_step_is_raised_when_the_loop_ends() -> None:
    script = textwrap.dedent("""
        import os, signal
        from agentrl.interrupts import between_steps, install
        install()
        try:
            with between_steps():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):
                    pass
                print("the step ran to its end")
        except KeyboardInterrupt:
            print("raised at the loop's end")
    """)
    done = _python(script)
    assert done.stdout.split("\n")[:2] == ["the step ran to its end", "raised at the loop's end"], done.stderr


# Python prints and ignores an exception raised inside a weakref callback (SQLAlchemy's registry cleanup, run by
# a garbage collection, swallowed a Ctrl-C this way before a warm start's loop, which then trained on for good).
SWALLOW = """
    import os, signal, weakref
    from agentrl.interrupts import install
    install()
    class Thing:
        pass
    def cleanup(ref):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass
    thing = Thing()
    ref = weakref.ref(thing, cleanup)
    del thing                     # the callback runs here, receives the signal, and Python ignores it
    print("went on after the callback")
"""


def test_a_signal_swallowed_by_a_weakref_callback_is_raised_again_at_the_next_stop_point() -> None:
    script = textwrap.dedent(SWALLOW) + textwrap.dedent("""
        from agentrl.interrupts import between_steps, stop_point
        done = []
        try:
            with between_steps():
                for step in range(3):
                    stop_point()
                    done.append(step)
        except KeyboardInterrupt:
            print("raised at the stop point after steps", done)
    """)
    done = _python(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["went on after the callback", "raised at the stop point after steps []"], \
        (done.stdout, done.stderr)
    # the first line shows the swallowing really happened; Python's report of it is not printed (our own signal)
    assert "agentrl: Ctrl-C was swallowed by a library's cleanup code; stopping here" in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_other_exceptions_a_callback_swallows_are_still_reported() -> None:
    script = textwrap.dedent("""
        import weakref
        from agentrl.interrupts import install
        install()
        class Thing:
            pass
        def cleanup(ref):
            raise ValueError("a real bug in a cleanup")
        thing = Thing()
        ref = weakref.ref(thing, cleanup)
        del thing
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "Exception ignored" in done.stderr and "ValueError: a real bug in a cleanup" in done.stderr, done.stderr


def test_an_eval_stops_at_its_next_chunk_after_a_swallowed_signal() -> None:
    # `agentrl eval` has no training loop and so no stop point: a swallowed Ctrl-C let it play every task.
    script = textwrap.dedent(SWALLOW) + textwrap.dedent("""
        from agentrl.config.sampling import Sampling
        from agentrl.play.evaluate import play_tasks
        class Runner:
            chunks = 0
            async def play_rows(self, rows, samples, **kwargs):
                Runner.chunks += 1
                return []
        class Services:
            runner = Runner()
        try:
            play_tasks(Services(), [{}] * 10, samples=1, sampling=Sampling(1.0, 1.0, 0), seed_parts=(),
                       chunk=2)
            print("played every chunk:", Runner.chunks)
        except KeyboardInterrupt:
            print("stopped after chunks:", Runner.chunks)
    """)
    done = _python(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["went on after the callback", "stopped after chunks: 1"], \
        (done.stdout, done.stderr)
    assert "agentrl: Ctrl-C was swallowed by a library's cleanup code; stopping here" in done.stderr


def test_a_deferred_signal_waits_for_its_stop_point_not_an_eval_chunk() -> None:
    # A mid-run eval runs inside a training step: the step's promise ("stopping at the end of this step") holds.
    script = textwrap.dedent("""
        import os, signal
        from agentrl.interrupts import between_steps, install, stop_point, swallowed_point
        install()
        try:
            with between_steps():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):
                    pass
                swallowed_point()
                print("the eval chunk went on")
                stop_point()
                print("not stopped")
        except KeyboardInterrupt:
            print("raised at the stop point")
    """)
    done = _python(script)
    assert done.stdout.split("\n")[:2] == ["the eval chunk went on", "raised at the stop point"], \
        (done.stdout, done.stderr)
