"""`trainer=miles`: GRPO on Miles (Ray, SGLang, Megatron), many GPUs and nodes.

`fit()` checks everything it can before starting anything (Miles installed, GPUs, batch sizes, KL and its
reference), serves the env (unless `env.server.url`), writes the rows Miles reads as prompt and eval data,
then runs `python -m agentrl.trainers.miles.launcher` (what Miles' train.py does; the wheel lacks it) on
the Ray cluster named by RAY_ADDRESS, or a local one. Miles logs into this run's MLflow run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agentrl.config.env import EnvServerConfig
from agentrl.config.schema import RunConfig
from agentrl.config.trainer import MilesTrainerConfig
from agentrl.trainers.common.protocol import TrainerBase
from agentrl.trainers.miles.args import (
    LaunchContext,
    MilesConfigError,
    MilesLaunch,
    build_launch,
    check_config,
    fixed_chat_template,
    megatron_model_args,
    miles_settings,
    rollout_gpus,
)
from agentrl.trainers.miles.rubric import env_server_reward

if TYPE_CHECKING:
    from agentrl.config.logger import MLflowLoggerConfig

log = logging.getLogger(__name__)

DEFAULT_TOKEN_VAR = "AGENTRL_ENV_TOKEN"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class MilesUnavailable(RuntimeError):
    """Miles, its light dependencies, or the GPUs it needs are missing."""


def project_root() -> str:
    """The folder holding the `agentrl` package, so Ray workers import the same code."""
    return str(Path(__file__).resolve().parents[3])  # agentrl/trainers/miles/trainer.py -> the checkout


def _pythonpath() -> str:
    parts = [project_root(), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return os.pathsep.join(dict.fromkeys(parts))


def require_miles() -> None:
    """Miles (with the modules its agentic path imports) must be importable."""
    missing = [m for m in ("miles", "ray", "sglang", "openai", "IPython", "setproctitle", "pybase64")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise MilesUnavailable(
            f"trainer=miles needs Miles: missing {', '.join(missing)}. On a GPU machine: "
            "`pip install -e '.[miles]'` plus Miles' CUDA stack; see docs/miles.md")


def require_gpus(settings: RunConfig) -> None:
    """Enough GPUs here, or a Ray cluster named by RAY_ADDRESS (the launcher checks its GPUs)."""
    if os.environ.get("RAY_ADDRESS"):
        return
    t = miles_settings(settings)
    if t.num_nodes > 1:
        raise MilesUnavailable(f"trainer.num_nodes={t.num_nodes} needs a Ray cluster: set RAY_ADDRESS")
    needed = t.gpus_per_node + (0 if t.colocate else rollout_gpus(settings))
    try:
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        have = 0
    if have < needed:
        raise MilesUnavailable(
            f"trainer=miles needs {needed} GPU(s) on this machine (gpus_per_node={t.gpus_per_node}"
            f"{'' if t.colocate else f' + rollout {rollout_gpus(settings)}'}) and found {have}; "
            "set RAY_ADDRESS to use a Ray cluster, or use trainer=grpo on a CPU")


def _advertised(host: str) -> str:
    """A host the Ray workers can reach for a server bound to `host`."""
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostbyname(socket.gethostname())
    return host


class MilesTrainer(TrainerBase):
    """Runs one Miles training job for the plan's typed settings; `fit()` returns the run's final metrics."""

    resumes_itself = True  # trainer.resume=latest becomes Miles' --load of its save folder
    checks_model_itself = True  # model.path lives on Miles' machines: the plan leaves it to preflight()

    def __init__(self, *, plan: Any, tracker: Any) -> None:
        self.plan, self.tracker = plan, tracker
        self.settings: RunConfig = plan.settings
        try:
            check_config(self.settings)
        except MilesConfigError as err:
            raise SystemExit(f"agentrl: {err}") from None

    @classmethod
    def plan_problem(cls, settings: RunConfig) -> str | None:
        """Why these typed settings (`RunConfig`) cannot make a Miles run (batch sizes, placement, KL, parsers;
        None: they can): the plan refuses them on any machine, before anything starts."""
        try:
            check_config(settings)
        except MilesConfigError as err:
            return str(err)
        return None

    # ------------------------------------------------------------------ dry run

    @classmethod
    def dry_run_report(cls, plan: Any) -> str:
        """The exact launcher command and environment `fit()` would use (rows paths as they would be)."""
        from agentrl.tracking.uri import resolve_tracking_uri

        run: RunConfig = plan.settings
        try:
            check_config(run)
            run_dir = Path(plan.run_dir)
            logger = cast("MLflowLoggerConfig", run.logger)  # logger=mlflow, the one logger
            ctx = LaunchContext(
                rows={s: run_dir / "rows" / f"{s}.jsonl" for s in (run.env.train_split, run.env.eval_split)},
                save_dir=cls.save_dir(miles_settings(run), run_dir),
                tracking_uri=resolve_tracking_uri(logger.tracking_uri, run.paths.output_root),
                experiment=logger.experiment, run_id="<mlflow-run-id>",
                env_token_var=cls.token_var(run.env.server), env_token="<token>", pythonpath=_pythonpath(),
                dry_run=True)
            notes: list[str] = []
            model_args = cls.model_args(run, notes)
            launch = build_launch(run, ctx, model_args=model_args)
        except MilesConfigError as err:
            raise SystemExit(f"agentrl: {err}") from None
        server = run.env.server
        env_note = server.url or f"started for this run on {server.host} (its URL goes in the rows)"
        lines = [f"miles: env server {env_note}; rows written to {run_dir / 'rows'}", *notes, launch.report()]
        lines += [f"warning: before the real run, {w}" for w in cls.missing_for_real_run(miles_settings(run))]
        return "\n".join(lines)

    @staticmethod
    def missing_for_real_run(trainer: MilesTrainerConfig) -> list[str]:
        """What a dry run could do without but `fit()` needs installed (Miles, its template package)."""
        missing = []
        try:
            require_miles()
        except MilesUnavailable as err:
            missing.append(str(err).removeprefix("trainer=miles needs Miles: "))
        try:
            trainer.chat_template_path or fixed_chat_template(trainer.tito_model)
        except MilesConfigError as err:
            missing.append(str(err))
        return missing

    @staticmethod
    def save_dir(trainer: MilesTrainerConfig, run_dir: Path) -> Path:
        """Miles' --save (and --load) folder: trainer.save_dir, else the run's checkpoints folder."""
        return Path(trainer.save_dir) if trainer.save_dir else Path(run_dir) / "checkpoints"

    @staticmethod
    def token_var(server: EnvServerConfig) -> str | None:
        """The env server's token variable; a server reachable beyond loopback always gets one."""
        if server.token_var:
            return server.token_var
        if not server.url and server.host not in _LOOPBACK:
            return DEFAULT_TOKEN_VAR
        return None

    @staticmethod
    def model_args(settings: RunConfig, notes: list[str] | None = None) -> list[str] | None:
        """Megatron's architecture flags from model.path/config.json (None for FSDP)."""
        if miles_settings(settings).train_backend != "megatron":
            return None
        try:
            return megatron_model_args(settings.model.path)
        except MilesConfigError as err:
            if notes is None:
                raise
            notes.append(f"miles: note: {err}; the architecture flags are added when it exists")
            return None

    # ------------------------------------------------------------------ training

    def preflight(self) -> list[str]:
        """Every check before anything starts; returns Megatron's model flags."""
        require_miles()
        require_gpus(self.settings)
        t, model_path = miles_settings(self.settings), self.settings.model.path
        if not Path(model_path).is_dir():
            raise MilesUnavailable(f"model.path {model_path} is not a folder on this machine")
        if t.ref_checkpoint and not Path(t.ref_checkpoint).exists():
            raise MilesConfigError(f"trainer.ref_checkpoint {t.ref_checkpoint} does not exist")
        return self.model_args(self.settings) or []

    def env_app(self, token: str | None) -> Any:
        """The env server app this run serves the plan's bundle with, as `env.server` and `sandbox` set it."""
        from agentrl.envs.server import build_app

        server = self.settings.env.server
        # The reward group's weighting is applied by the env server: Miles' agent call carries no reward_fn.
        return build_app(self.plan.bundle, token=token, reward=env_server_reward(self.plan),
                         sandbox=dataclasses.asdict(self.settings.sandbox), **server.app_options())

    def _start_env_server(self) -> tuple[str, Any, str | None, str | None]:
        """(url, stop or None, token variable, token) for the env server the rows will name."""
        server = self.settings.env.server
        var = self.token_var(server)
        token = os.environ.get(var) if var else None
        if server.url:
            if var and not token:
                raise MilesConfigError(f"env.server.token_var={var} but that environment variable is unset")
            return server.url, None, var, token
        from agentrl.envs.server import start_server_in_thread

        if var and not token:
            token = secrets.token_urlsafe(32)  # a fresh server: its token is ours to choose
            os.environ[var] = token
        url, stop = start_server_in_thread(self.env_app(token), server.host, server.port)
        host = _advertised(server.host)
        url = url.replace(f"//{server.host}:", f"//{host}:", 1) if host != server.host else url
        return url, stop, var, token

    def fit(self) -> dict[str, float]:
        """Serve the env, write the rows, run Miles to the end; the run's last value of each metric."""
        from agentrl.rows import write_rows

        try:
            model_args = self.preflight()
        except (MilesConfigError, MilesUnavailable) as err:
            raise SystemExit(f"agentrl: {err}") from None
        run_dir = Path(self.plan.run_dir)
        url, stop, var, token = self._start_env_server()
        try:
            run = self.settings
            rows = write_rows(url, run_dir / "rows", max_turns=run.agent.max_turns,
                              tool_timeout=run.env.server.tool_timeout, reset_timeout=run.env.server.reset_timeout,
                              token_var=var)
            ctx = LaunchContext(rows=rows, save_dir=self.save_dir(miles_settings(run), run_dir),
                                tracking_uri=self.tracker.tracking_uri, experiment=self.tracker.experiment,
                                run_id=self.tracker.run_id, env_token_var=var, env_token=token,
                                pythonpath=_pythonpath())
            launch = build_launch(run, ctx, model_args=model_args)
            (run_dir / "miles_command.txt").write_text(launch.report() + "\n")
            self.run_launcher(launch, run_dir / "miles.log")
        finally:
            if stop is not None:
                stop()
        return self.final_metrics()

    @staticmethod
    def run_launcher(launch: MilesLaunch, log_path: Path) -> None:
        """Run the launcher, teeing its output to `log_path`; a non-zero exit raises with the log's tail."""
        env = {**os.environ, **launch.env}
        log.info("starting Miles: %s (log %s)", " ".join(launch.command[:3]), log_path)
        tail: list[str] = []
        with open(log_path, "w") as out:
            proc = subprocess.Popen(launch.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    out.write(line)
                    sys.stdout.write(line)
                    tail = (tail + [line])[-40:]
                code = proc.wait()
            except BaseException:
                proc.terminate()
                proc.wait(timeout=60)
                raise
        if code != 0:
            raise RuntimeError(f"Miles exited with {code}; last lines of {log_path}:\n{''.join(tail)}")

    def final_metrics(self) -> dict[str, float]:
        """The last logged value of every metric in this run (Miles logged them there)."""
        return self.tracker.latest_metrics()
