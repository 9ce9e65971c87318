"""`trainer=trl`: TRL's GRPOTrainer trains the recipe's policy, our agent plays, our evaluator scores.

`fit()`: the SFT warm start (the same folder `trainer=grpo` uses), then TRL in this process
(`trainer.num_processes=1`) or under `accelerate launch` (>1: data-parallel ranks, gloo on CPUs) running
`worker.py`. Metrics reach the run's Tracker: directly, or from rank 0's JSON Lines file, which a thread
forwards while the workers run. At the end: the final model (logged), the reward curves, the time totals.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.config.portable import to_portable
from agentrl.config.schema import RunConfig, trainer_settings
from agentrl.config.trainer import TRLTrainerConfig
from agentrl.console import progress, run_relayed
from agentrl.play.dependency_breaker import DependencyLost
from agentrl.play.eval_results import EVALS_DIR, publish
from agentrl.play.evaluate import step_line
from agentrl.tracking.trace_file import read_trace_file
from agentrl.trainers.common.no_update import NoUpdateWatch
from agentrl.trainers.common.plots import reward_curves
from agentrl.trainers.common.protocol import TrainerBase
from agentrl.trainers.common.resume import TRANSFORMERS, checkpoint_record, checkpoint_root, resumed_history
from agentrl.trainers.sft.warm_start import warm_start_path
from agentrl.trainers.trl.args import (
    TRLConfigError,
    check_config,
    grpo_config_kwargs,
    launch_command,
    peft_kwargs,
    report,
    use_cpu,
)
from agentrl.trainers.trl.worker import LOST_FILE, TRACES_PREFIX

log = logging.getLogger(__name__)


def require_trl() -> None:
    """TRL is an extra: say how to get it instead of an ImportError deep in the worker."""
    try:
        import trl  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("trainer=trl needs TRL: pip install -e '.[trl]'") from exc


class MetricsForwarder:
    """Tails rank 0's metrics file into the Tracker while the workers run (and once more at the end)."""

    def __init__(self, path: Path, tracker: Any, history: dict[str, list[tuple[int, float]]],
                 watch: NoUpdateWatch | None = None) -> None:
        self.path, self.tracker, self.history, self.watch = path, tracker, history, watch
        self.offset = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="agentrl-trl-metrics", daemon=True)

    def _drain(self) -> None:
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self.offset)
            while (line := f.readline()).endswith("\n"):  # a half-written last line waits for the next pass
                self.offset = f.tell()
                entry = json.loads(line)
                record(entry["metrics"], int(entry["step"]), self.tracker, self.history, self.watch)

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            self._drain()

    def __enter__(self) -> MetricsForwarder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._drain()


def log_rank_files(run_dir: Path, tracker: Any, since: float) -> None:
    """Log what the accelerate ranks left in `run_dir` for the tracker they lack: rank 0's per-task eval files
    written after `since` (a time.time()) and every rank's episode traces. A file that cannot be logged (a rank
    killed while writing it) is named in the log and skipped: it must not hide the others, nor the run's outcome."""
    evals = [(path, lambda p: publish(tracker, p)) for path in sorted((run_dir / EVALS_DIR).glob("*.jsonl"))
             if path.stat().st_mtime >= since]
    traces = [(path, lambda p: tracker.log_traces(read_trace_file(p)))
              for path in sorted(run_dir.glob(f"{TRACES_PREFIX}*.jsonl"))]
    for path, log_file in [*evals, *traces]:
        try:
            log_file(path)
        except Exception:  # noqa: BLE001 - one bad file costs only itself
            log.exception("trainer=trl: could not log %s", path)


def record(metrics: dict[str, float], step: int, tracker: Any, history: dict[str, list[tuple[int, float]]],
           watch: NoUpdateWatch | None = None) -> None:
    """Log one step's metrics, keep the reward curves' points and let `watch` see steps without an update."""
    tracker.log(metrics, step=step)
    if "train/reward" in metrics:  # a training step's metrics (an eval's come alone)
        progress(step_line("trl", step, None, metrics))
    if watch is not None:
        watch.add(step, metrics)
    for key in history:
        if key in metrics:
            history[key].append((step, float(metrics[key])))


class TRLTrainer(TrainerBase):
    """TRL's GRPOTrainer behind agentrl's trainer interface (see the module docstring). TRL's loop runs the
    steps (`fit`); `setup` finds the start folder, `cleanup` draws the reward curves."""

    checkpoint_kind = TRANSFORMERS  # trainer.resume resolves to TRL's own checkpoint-N/ (resume_from_checkpoint)

    def __init__(self, *, plan: Any, tracker: Any) -> None:
        self.plan, self.tracker = plan, tracker
        try:
            check_config(plan.settings)
        except TRLConfigError as err:
            raise SystemExit(f"agentrl: {err}") from None
        self.history: dict[str, list[tuple[int, float]]] = {"train/reward": [], "eval/reward": []}
        self.no_update = NoUpdateWatch(penalize=self.t.model_failures == "drop")
        self.start_path, self.warm_s = "", 0.0
        self.resume_from: str | None = None

    @property
    def settings(self) -> RunConfig:
        """The run's typed config (`Plan.settings`)."""
        return self.plan.settings

    @property
    def t(self) -> TRLTrainerConfig:
        """`trainer=trl`'s typed settings (`Plan.settings.trainer`)."""
        return trainer_settings(self.settings, TRLTrainerConfig)

    @classmethod
    def plan_problem(cls, settings: RunConfig) -> str | None:
        """Why these typed settings (`RunConfig`) cannot run under TRL (None: they can); the plan refuses them
        before anything starts."""
        try:
            check_config(settings)
        except TRLConfigError as err:
            return str(err)
        return None

    @classmethod
    def dry_run_report(cls, plan: Any) -> str:
        """The exact GRPOConfig and launch command `fit()` would use."""
        s: RunConfig = plan.settings
        t = trainer_settings(s, TRLTrainerConfig)
        try:
            check_config(s)
        except TRLConfigError as err:
            raise SystemExit(f"agentrl: {err}") from None
        run_dir = Path(plan.run_dir)
        kwargs = grpo_config_kwargs(s, output_dir=checkpoint_root(s, "<mlflow-run-id>"), cpu=use_cpu(t))
        multi = t.num_processes > 1
        lines = [report(kwargs, launch_command(t, run_dir / "trl_spec.json") if multi else None, peft_kwargs(s)),
                 "rollout_func: agentrl.trainers.trl.worker.Bridge (agent "
                 f"{plan.choices.get('agent')}, reward {plan.choices.get('reward')}, max_turns={s.agent.max_turns})",
                 f"eval: agentrl's evaluator on split {s.env.eval_split} (limit {t.eval_limit}) before "
                 f"step 1, every {t.eval_every} steps and after the last"]
        try:
            require_trl()
        except RuntimeError as err:
            lines.append(f"warning: before the real run, {err}")
        return "\n".join(lines)

    def setup(self, plan: Any) -> int:
        """The start folder (a resumed TRL checkpoint, or the warm start, made if missing); the first step."""
        require_trl()
        self.plan = plan
        started = time.monotonic()
        # A resume starts from TRL's checkpoint folder (model and tokenizer); TRL restores the rest from it.
        resume = plan.resume
        self.resume_from = str(resume.checkpoint) if resume is not None and resume.checkpoint is not None else None
        first = 1
        if self.resume_from:
            first = int(resume.step) + 1
            print(f"resuming from {self.resume_from} at step {first}", flush=True)
            self.history = resumed_history(resume.checkpoint, int(resume.step), list(self.history))
        self.start_path = self.resume_from or warm_start_path(plan, self.tracker)
        self.warm_s = time.monotonic() - started
        return first

    def cleanup(self) -> None:
        """The reward curves, whatever happened."""
        self._plot(Path(self.plan.run_dir))

    def closing_lines(self) -> list[str]:
        """The end-of-run block's lines about steps that trained nothing."""
        return self.no_update.closing_lines()

    def fit(self) -> dict[str, float]:
        """`setup`, then TRL's loop, then `cleanup`; returns the final metrics (their `eval/reward` is the
        objective)."""
        t = self.t
        self.setup(self.plan)
        start_path, resume_from, warm_s = self.start_path, self.resume_from, self.warm_s
        run_dir = Path(self.plan.run_dir)
        output_dir = checkpoint_root(self.plan.settings, self.tracker.run_id)
        resumed: dict[str, Any] = {"resume_from": resume_from,
                                   "record": checkpoint_record(self.plan, self.tracker.run_id)}
        self.tracker.set_tags({"agentrl.backend": "trl", "agentrl.trl.num_processes": t.num_processes})
        try:
            if t.num_processes > 1:
                final = self._launch(start_path, run_dir, output_dir, resumed)
            else:
                from agentrl.trainers.trl.worker import train

                final = train(self.plan, start_path=start_path, output_dir=str(output_dir), run_dir=str(run_dir),
                              sink=lambda m, step: record(m, step, self.tracker, self.history, self.no_update),
                              **resumed)
            folder = run_dir / "final_model"
            if folder.is_dir():
                self.tracker.log_model(folder)
        finally:
            self.cleanup()
        final.pop("history", None)
        if not resume_from and self.t.warm_start.enabled:  # name only the stages that ran
            final["time/warm_start_total_s"] = warm_s
        if no_update := self.no_update.metrics():
            self.tracker.log(no_update, step=t.steps)
            final.update(no_update)
        return {k: float(v) for k, v in final.items() if isinstance(v, int | float)}

    def _launch(self, start_path: str, run_dir: Path, output_dir: Path, resumed: dict[str, Any]) -> dict[str, Any]:
        """Run the workers under `accelerate launch`; forward rank 0's metrics; return its final metrics."""
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics_path, final_path = run_dir / "trl_metrics.jsonl", run_dir / "trl_final.json"
        metrics_path.unlink(missing_ok=True)
        final_path.unlink(missing_ok=True)
        (run_dir / LOST_FILE).unlink(missing_ok=True)
        for stale in run_dir.glob(f"{TRACES_PREFIX}*.jsonl"):
            stale.unlink()
        # Each rank rebuilds the plan from the typed settings and the choices (agentrl/trl_rank.py).
        spec = {"config": to_portable(self.settings), "choices": dict(self.plan.choices), "start_path": start_path,
                "output_dir": str(output_dir), "run_dir": str(run_dir), "metrics_path": str(metrics_path),
                "final_path": str(final_path), "trace_train_fraction": self.tracker.trace_train_fraction, **resumed}
        spec_path = run_dir / "trl_spec.json"
        spec_path.write_text(json.dumps(spec))
        t = self.t
        command = launch_command(t, spec_path)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the checkout (above agentrl/trainers/trl/), for workers started from another folder
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", str(t.threads or 1))  # torchrun's default otherwise warns and picks 1
        print(f"trl: launching {t.num_processes} processes: {' '.join(command)}", flush=True)
        launched = time.time()
        with MetricsForwarder(metrics_path, self.tracker, self.history, self.no_update):
            returncode = run_relayed(command, env=env, cwd=run_dir)  # their lines reach the run's log too
        log_rank_files(run_dir, self.tracker, launched)  # a failed run's evals and traces too
        if returncode != 0 and (run_dir / LOST_FILE).is_file():
            raise DependencyLost((run_dir / LOST_FILE).read_text())
        if returncode != 0:
            raise RuntimeError(f"trainer=trl: the accelerate workers exited with {returncode} (their output "
                               "is above)")
        if not final_path.is_file():
            raise RuntimeError(f"trainer=trl: rank 0 wrote no final metrics ({final_path})")
        return json.loads(final_path.read_text())

    def _plot(self, run_dir: Path) -> None:
        try:
            path = reward_curves(self.history, run_dir / "reward_curves.png", title=self.settings.task_name)
            self.tracker.log_artifact(path, "plots")
        except Exception:  # noqa: BLE001 - a missing figure must not fail a finished run
            log.exception("could not draw the reward curves")
