"""Ctrl-C soak: tiny GRPO runs, each stopped by a signal at a random moment of its training, counted by how they end.

    python benchmarks/studies/soak_ctrl_c.py --runs 30                      # this checkout
    python benchmarks/studies/soak_ctrl_c.py --runs 30 --tree /tmp/old      # another one (`git archive REV | tar -x`)

Each run is tests/test_ctrl_c.py's: arith on an untrained 1-layer model, a checkpoint every step, the signal sent
0-3 s (uniform, seeded) after the first checkpoint. A clean stop exits 130 (143 for SIGTERM) with no traceback and
its MLflow run KILLED; anything else is printed with its stderr's tail. A run still alive 300 s after its signal is
a hang (killed, counted). Results: benchmarks/RESULTS.md, "Ctrl-C soak".
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.test_ctrl_c import TINY  # noqa: E402 - the test's run, so the soak is the test's case many times


def one_run(tree: Path, home: Path, sig: int, delay: float) -> tuple[str, str]:
    """(how it ended, the stderr tail when not clean)."""
    args = [*TINY, "trainer.warm_start.enabled=false", "trainer.steps=400"]
    env = dict(os.environ, AGENTRL_HOME=str(home), PYTHONPATH=str(tree),
               MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}")
    ckpts = home / "outputs" / "checkpoints"
    err_path = home.parent / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl", *args], cwd=tree, env=env,
                                stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        while not any(ckpts.glob("*/*/step-*/state.pt")):
            if proc.poll() is not None:
                return "ended before its first checkpoint", err_path.read_text()[-1500:]
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(sig)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return "hang", err_path.read_text()[-1500:]
    stderr = err_path.read_text()
    status = sqlite3.connect(home / "mlflow.db").execute("select status from runs").fetchall()
    clean = proc.returncode in ((130, -signal.SIGINT) if sig == signal.SIGINT else (143,))
    if clean and "Traceback" not in stderr and status == [("KILLED",)]:
        return "clean", ""
    return f"exit {proc.returncode}, runs {status}", stderr[-1500:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--tree", type=Path, default=REPO, help="the agentrl checkout to run (default: this one)")
    ap.add_argument("--signal", choices=("SIGINT", "SIGTERM"), default="SIGINT")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sig = getattr(signal, args.signal)
    ends: Counter[str] = Counter()
    began = time.monotonic()
    for i in range(args.runs):
        home = Path(tempfile.mkdtemp(prefix="soak-ctrl-c-")) / "home"
        home.mkdir()
        end, tail = one_run(args.tree.resolve(), home, sig, rng.uniform(0, 3))
        ends[end] += 1
        print(f"run {i}: {end}", flush=True)
        if tail:
            print(tail, flush=True)
        shutil.rmtree(home.parent, ignore_errors=True)
    print(f"\n{args.signal} x {args.runs} on {args.tree} ({(time.monotonic() - began) / 60:.1f} min): "
          + ", ".join(f"{n} {end}" for end, n in ends.most_common()))


if __name__ == "__main__":
    main()
