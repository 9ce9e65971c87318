"""Dependency fault phases of the soak: a real training run whose env server or engine dies mid-run.

    python benchmarks/studies/soak.py --sandboxes '' --phases all              # every phase below (~15 min on 2 cores)
    python benchmarks/studies/soak.py --sandboxes '' --phases grpo-env-killed,trl-env-frozen-wait

Each phase runs `python -m agentrl +recipe=gridsim_grpo` (tiny model, no warm start, `trainer=grpo` or `trl`)
against an env server in its own process (`env.server.url`), and once the run's step-2 rollouts reach the server
(by its `connection open` log lines) hits one dependency:

* `env-killed`: the env server gets SIGKILL; `env-frozen`: SIGSTOP (it keeps its port: TCP connects, nothing
  answers); with `-wait` (`trainer.on_dependency_loss=wait`) it is brought back (restarted on the same port, or
  SIGCONT) once the run says it waits for it;
* `engine-killed`: the embedded engine's worker dies (`doom_engine` below, as a CUDA fault or an OOM would end
  it): every chat answers 503 and the session server's /health turns 503.

Reported per phase: seconds from the fault to the first console line naming the dependency, to the run's end (the
stop, or with `-wait` the end of the last step), whether the stop line named it, and with `-wait` the rollouts lost
(flagged for the outage in any step's metrics: must be 0) and whether every step ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DIE_VAR = "AGENTRL_SOAK_ENGINE_DIES"  # the engine worker dies once this file exists (doom_engine)
PHASES = ("grpo-env-killed", "grpo-env-frozen", "grpo-env-killed-wait", "grpo-env-frozen-wait", "grpo-engine-killed",
          "trl-env-killed", "trl-env-frozen", "trl-env-killed-wait", "trl-env-frozen-wait")
TINY = ["+recipe=gridsim_grpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=1",
        "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.warm_start.enabled=false",
        "agent.max_response_tokens=64", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024"]
ENV_FLAGS = ("env_unreachable", "env_gone", "env_auth", "deploy", "tool_timeout")


def doom_engine() -> None:
    """The engine-killed phase's fault: the embedded engine's worker raises once the file named by
    $AGENTRL_SOAK_ENGINE_DIES exists, as a CUDA fault or an OOM would end it (every request then fails with
    EngineUnavailable, the session server answers 503). Installed by this file's `__main__`, which then runs
    `python -m agentrl` (a plan accepts only agentrl's own targets, so no config can name a test engine)."""
    from agentrl.inference.engines.embedded.engine import EmbeddedEngine

    decode = EmbeddedEngine._decode_step

    def _decode_step(self: EmbeddedEngine) -> None:
        if os.path.exists(os.environ.get(DIE_VAR, "/nonexistent")):
            raise RuntimeError("soak: the engine's worker was killed")
        decode(self)

    EmbeddedEngine._decode_step = _decode_step  # type: ignore[method-assign]


@dataclass
class PhaseReport:
    """One phase's figures (see the module docstring)."""

    phase: str
    named_s: float | None = None  # fault -> the first console line naming the dependency
    ended_s: float | None = None  # fault -> the run's exit
    exit_code: int | None = None
    stop_line: str = ""
    named_in_stop: bool = False
    steps_done: int = 0
    steps: int = 0
    lost: int | None = None  # with -wait: rollouts flagged for the outage (must be 0)
    notes: list[str] = field(default_factory=list)


class Console:
    """A subprocess's output, line by line with the time each arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, text: str, after: float = 0.0) -> float | None:
        return next((t for t, line in list(self.lines) if t >= after and text in line), None)

    def wait_for(self, text: str, after: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if (t := self.first(text, after)) is not None:
                return t
            time.sleep(0.2)
        return self.first(text, after)


def _env_server(port: int, log: Path) -> subprocess.Popen:
    from agentrl.testing.processes import wait_healthy

    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl.envs.serve", "env=gridsim", "env.prompt_style=compact",
                                 f"port={port}", "log_level=info"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    wait_healthy(proc, f"http://127.0.0.1:{port}", timeout=300, log=log)
    return proc


def _opened(log: Path) -> int:
    return log.read_text(errors="replace").count("connection open") if log.exists() else 0


def _lost(home: Path, steps_key: str = "train/reward") -> tuple[int, int]:
    """(rollouts flagged for the env in any step, steps logged) from the run's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    rid = run.info.run_id
    drawn = {m.step: m.value for m in client.get_metric_history(rid, "rollout/rows_drawn")}
    lost = 0.0
    for flag in ENV_FLAGS:
        for m in client.get_metric_history(rid, f"rollout/flagged/{flag}"):
            lost += m.value * drawn.get(m.step, 0.0) * 2  # share x rows x samples_per_prompt (2)
    return round(lost), len(client.get_metric_history(rid, steps_key))


def run_phase(phase: str, args: Any, logs: Path, port: int) -> PhaseReport:
    """Run one phase (see the module docstring) and return its figures."""
    trainer, target, fault = phase.split("-")[0], phase.split("-")[1], phase.split("-")[2]
    wait = phase.endswith("-wait")
    rep = PhaseReport(phase, steps=args.phase_steps if wait else 200)
    home = logs / f"{phase}-home"
    env_log = logs / f"{phase}-env.log"
    die = logs / f"{phase}-engine-dies"
    server = _env_server(port, env_log)
    url = f"http://127.0.0.1:{port}"
    argv = [*TINY, f"trainer={trainer}", f"trainer.steps={rep.steps}", f"env.server.url={url}",
            f"trainer.dependency_grace_s={args.grace_s}", f"trainer.on_dependency_loss={'wait' if wait else 'stop'}"]
    if trainer == "grpo":
        argv.append("trainer.max_extra_rows=2")
    env = {**os.environ, "AGENTRL_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", DIE_VAR: str(die)}
    runner = [str(Path(__file__).resolve())] if target == "engine" else ["-m", "agentrl"]  # the doomed engine
    command = [sys.executable, *runner, *argv]
    print(f"[{phase}] {' '.join(command[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    console = Console(proc)
    try:
        # Step 0's eval opens one episode and each step 4: hit the dependency as step 2's rollouts start.
        deadline = time.monotonic() + 1200
        while _opened(env_log) < 6 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None:
            rep.notes.append("the run ended before the fault")
            return rep
        hit = time.monotonic()
        if target == "engine":
            die.touch()
        else:
            server.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        name = url if target == "env" else "engine"
        if wait:
            if console.wait_for("waiting for its /health", hit, args.grace_s + 600) is None:
                rep.notes.append("the run never said it waits")
            elif fault == "killed":
                server.wait()
                server = _env_server(port, env_log)
            else:
                server.send_signal(signal.SIGCONT)
        rep.exit_code = proc.wait(timeout=1800)
        rep.ended_s = time.monotonic() - hit
        console.thread.join(30)
        named = console.first(name, hit)
        rep.named_s = None if named is None else named - hit
        stops = [line for _, line in console.lines if line.startswith("agentrl: ")]
        rep.stop_line = stops[-1] if stops else ""
        rep.named_in_stop = name in rep.stop_line
        if wait:
            rep.lost, rep.steps_done = _lost(home)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.send_signal(signal.SIGCONT)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        (logs / f"{phase}-run.log").write_text("\n".join(line for _, line in console.lines))
    return rep


def phase_table(reports: list[PhaseReport], grace_s: float) -> str:
    """One row per phase."""
    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.1f} s" if isinstance(v, float) else str(v))

    head = (f"{'phase':<22} | {'fault -> named':>14} | {'fault -> run end':>16} | {'exit':>4} | {'stop line names it':>18}"
            f" | {'steps':>7} | {'rollouts lost':>13}")
    rows = [head, "-" * len(head)]
    for r in reports:
        wait = r.phase.endswith("-wait")
        rows.append(f"{r.phase:<22} | {fmt(r.named_s):>14} | {fmt(r.ended_s):>16} | {fmt(r.exit_code):>4} | "
                    f"{('-' if wait else ('yes' if r.named_in_stop else 'NO')):>18} | "
                    f"{(f'{r.steps_done}/{r.steps}' if wait else '-'):>7} | {fmt(r.lost):>13}")
    rows.append(f"(trainer.dependency_grace_s={grace_s:g}; -wait phases must lose 0 rollouts and run every step)")
    return "\n".join(rows)


def bad(r: PhaseReport) -> bool:
    """A phase that failed its proof."""
    if r.phase.endswith("-wait"):
        return r.exit_code != 0 or r.lost != 0 or r.steps_done != r.steps
    return r.exit_code in (0, None) or not r.named_in_stop


def run_phases(names: list[str], args: Any, logs: Path) -> list[PhaseReport]:
    """Every named phase in order, each on a fresh env server (a port from `args.phase_port`, one per phase)."""
    unknown = [n for n in names if n not in PHASES]
    if unknown:
        raise SystemExit(f"soak: unknown phases {unknown}; choose from {', '.join(PHASES)} (or all)")
    return [run_phase(name, args, logs, args.phase_port + i) for i, name in enumerate(names)]


if __name__ == "__main__":  # `python benchmarks/studies/soak_dependency.py <agentrl overrides>`: the engine-killed run
    doom_engine()
    from agentrl.__main__ import main

    main()
