"""One Hydra job: check the composition, build the plan, open tracking, train, say where everything is."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from agentrl.config.register import recipe_names
from agentrl.config.validate import UnknownKeyError, check_typed_keys
from agentrl.envs.task import Bundle
from agentrl.group_filter import AllGroupsFailing
from agentrl.plan import Plan, PlanError, build_plan
from agentrl.play.dependency_breaker import DependencyLost
from agentrl.play.eval_results import latest_results, results_mean
from agentrl.play.eval_subset import eval_subset
from agentrl.tracking.tracker import DatasetRef, Tracker, continue_line
from agentrl.trainers.common.protocol import Trainer

log = logging.getLogger("agentrl")

# fit()'s metric keys that the closing block reports, when a trainer returns them (a stage that did not run
# returns none: no "warm start 1 s" for a run that started from the base model).
TIME_KEYS = (("warm start", "time/warm_start_total_s"), ("engine start", "time/engine_start_total_s"),
             ("training", "time/train_total_s"), ("eval", "time/eval_total_s"))


class RecipeNotFound(SystemExit):
    """`+recipe=NAME` named no recipe (Hydra would otherwise silently run the defaults)."""


def check_recipe(cfg: DictConfig) -> None:
    """Refuse a `recipe` key that is a plain string: the recipe group was not found, nothing was applied."""
    if isinstance(cfg.get("recipe"), str):
        raise RecipeNotFound(
            f"agentrl: unknown recipe {cfg.recipe!r}; the recipes are: {', '.join(recipe_names())}"
        )


def dataset_ref(bundle: Bundle, context: str, split: str) -> DatasetRef:
    """Split `split` of `bundle` as an MLflow dataset input that the run uses as `context` (train or eval)."""
    return DatasetRef(name=bundle.name, context=context, split=split, rows=bundle.splits()[split],
                      version=bundle.version, source=bundle.data_source(),
                      options=tuple(sorted(bundle.data_options().items())))


def dataset_refs(plan: Plan) -> list[DatasetRef]:
    """The bundle's train and eval splits as MLflow dataset inputs (one entry when both are the same split)."""
    env = plan.settings.env
    refs: dict[str, DatasetRef] = {}
    for context, split in (("train", env.train_split), ("eval", env.eval_split)):
        refs.setdefault(split, dataset_ref(plan.bundle, context, split))
    return list(refs.values())


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _value(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    try:
        return float(value) if value is not None and math.isfinite(float(value)) else None
    except (TypeError, ValueError):
        return None


def engine_unavailable() -> type[Exception]:
    """EngineUnavailable (an engine whose worker died), imported only when a run fails: it brings torch."""
    from agentrl.inference.engines.completion import EngineUnavailable

    return EngineUnavailable


def final_scores(metrics: dict[str, Any], run_dir: Path, subset: str | None) -> list[str]:
    """The closing block's eval lines: the environment's own grade of the last sampled and the greedy-decoded eval
    (from their per-task files, which every trainer using agentrl's evaluator writes) and on which tasks; the
    reward group's eval/reward beside it when that differs (reward=rubric), or alone when no file holds grades."""
    sampled, greedy = _value(metrics, "eval/reward"), _value(metrics, "eval_greedy/reward")
    if sampled is None and greedy is None:
        return []
    files = (latest_results(run_dir) if sampled is not None else None,
             latest_results(run_dir, "eval_greedy") if greedy is not None else None)
    grades = [results_mean(f) if f is not None else None for f in files]
    on = f" ({subset})" if subset and any(f is not None for f in files) else ""

    def line(name: str, values: tuple[float | None, ...] | list[float | None], tail: str) -> str:
        shown = [f"{v:.3f} {how}" for v, how in zip(values, ("sampled", "greedy-decoded"), strict=True)
                 if v is not None]
        return f"{name:<18} {', '.join(shown)}{tail}"

    if not any(g is not None for g in grades):
        return [line("final eval/reward", (sampled, greedy), on)]
    lines = [line("final eval/grade", grades, on)]
    rewards = (sampled, greedy)
    if any(r is not None and g is not None and abs(r - g) > 5e-4 for r, g in zip(rewards, grades, strict=True)):
        lines.append(line("final eval/reward", rewards, " (the reward group's score, shaped)"))
    return lines


def closing_block(*, status: str, run_dir: Path, tracker: Tracker, metrics: dict[str, Any], wall_s: float,
                  resumable: bool = True, stopped: str | None = None, subset: str | None = None) -> str:
    """The one block the end of a run prints: where it all is, what it scored (the env's grade, on which tasks:
    `subset`), where the time went, and (`stopped`: a run Ctrl-C ended) how to go on with it.

    Reports only what is present: a trainer that returns no greedy eval or no time split gets no such line.
    """
    lines = [f"== agentrl run {status} in {_minutes(wall_s)}", f"run folder    {run_dir}"]
    if uri := tracker.tracking_uri:
        lines.append(f"MLflow        {uri}  experiment {tracker.experiment}  run {tracker.run_id}")
        lines.append(f"browse        {tracker.ui_command()}")
        if url := tracker.url(charts=True):  # a training run's page opens on its charts
            lines.append(f"              then {url}")
    lines += final_scores(metrics, run_dir, subset)
    if results := latest_results(run_dir):
        lines.append(f"per-task eval {results} (and the eval table: MLflow artifacts, evals/)")
    stages = [(name, s) for name, key in TIME_KEYS if (s := _value(metrics, key)) is not None]
    if stages:
        parts = [f"{name} {_minutes(s)}" for name, s in stages]
        if (rest := wall_s - sum(s for _, s in stages)) >= 1:  # building the plan, loading the learner, MLflow
            parts.append(f"other {_minutes(rest)}")
        lines.append(f"wall time     {', '.join(parts)} (total {_minutes(wall_s)})")
    if stopped:
        lines.append(stopped)
    lines += tracker.dead_run_notes(resumable=resumable)  # earlier runs a kill left RUNNING, closed at this start
    return "\n".join(lines)


def eval_note(plan: Plan) -> str | None:
    """Which of the eval split's tasks the run's evals played (`trainer.eval_limit`): `40 of 200 tasks, stratified
    by duration_h`; None when it cannot say."""
    try:
        limit = vars(plan.settings.trainer).get("eval_limit")  # Miles declares none
        return eval_subset(plan.bundle, plan.settings.env.eval_split, limit).note
    except Exception:  # noqa: BLE001 - the closing block must not fail over a note
        return None


def stopped_line(plan: Plan, run_id: str | None, overrides: list[str]) -> str | None:
    """For a run Ctrl-C stopped: resume it from its newest checkpoint, or run it again when it wrote none (a stop
    during the warm start, or before the first `trainer.checkpoint_every`) or its trainer cannot resume."""
    if not run_id:
        return None
    from agentrl.trainers.sft.warm_start import stopped_sft_step

    try:
        sft_step = stopped_sft_step(plan)
    except Exception:  # noqa: BLE001 - the closing block of a stopped run must not fail over a note
        sft_step = None
    sft = f"its SFT continues from step {sft_step}" if sft_step else ""
    kind = plan.trainer_cls.checkpoint_kind
    if kind is None:
        return continue_line(overrides, run_id, resumable=False, why=sft)
    from agentrl.trainers.common.resume import checkpoint_step, run_checkpoint

    folder = run_checkpoint(plan.settings, run_id, kind)
    if folder is None:
        return continue_line(overrides, run_id, resumable=False,
                             why="; ".join(filter(None, ["it stopped before its first checkpoint", sft])))
    return f"{continue_line(overrides, run_id, resumable=True)}  (from step {checkpoint_step(folder, kind)})"


def check_reopenable(tracker: Tracker, target: Any) -> None:
    """Refuse, naming the store, a resume whose checkpoint's MLflow run is not in this tracking store."""
    if problem := tracker.reopen_problem(target.run_id):
        raise SystemExit(f"agentrl: trainer.resume: checkpoint {target.checkpoint} belongs to MLflow run "
                         f"{target.run_id}, which {tracker.tracking_uri} cannot open ({problem}); point "
                         "MLFLOW_TRACKING_URI or logger.tracking_uri at the store it was logged to")


def mark_resume(tracker: Tracker, plan: Plan, run_dir: Path) -> None:
    """Tag the reopened run with what it resumed (and what a forced resume changed) and log the config it resumes
    with: its params stay the values it started with (MLflow params never change)."""
    from omegaconf import OmegaConf

    from agentrl.config.schema import settings_dict

    tracker.set_tags(plan.resume.tags())
    resolved = run_dir / "config_resolved.yaml"
    resolved.parent.mkdir(parents=True, exist_ok=True)
    resolved.write_text(OmegaConf.to_yaml(settings_dict(plan.settings)))  # what the resume was checked against
    tracker.log_artifact(resolved, f"resume-step-{plan.resume.step}")


def job_plan(cfg: DictConfig, who: str = "agentrl") -> Plan:
    """Check the Hydra job's composition and build its tracked plan (`run`, `agentrl eval`); a refusal exits with
    one line, `<who>: <why>`."""
    check_recipe(cfg)
    try:
        check_typed_keys(cfg)  # also checked at compose time; here too for a config made another way
    except UnknownKeyError as err:
        raise SystemExit(f"{who}: {err}") from None
    hydra_cfg = HydraConfig.get()
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith(("hydra/", "schema/"))}
    try:
        return build_plan(cfg, choices=choices, run_dir=Path(hydra_cfg.runtime.output_dir), tracked=True)
    except PlanError as err:
        raise SystemExit(f"{who}: {err}") from None


def run(cfg: DictConfig) -> float | None:
    """Run one job; return its final eval/reward (the objective a sweeper maximizes), None for a dry run."""
    started = time.monotonic()
    # One INFO line per request (every chat turn, every session) would drown the progress bars.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    plan = job_plan(cfg)
    hydra_cfg = HydraConfig.get()
    choices, run_dir = plan.choices, plan.run_dir

    tracker = plan.tracker
    # A dry run never reopens the checkpoint's run: the plan's `resume` line says what a real run would resume.
    dry_run = plan.settings.dry_run
    resuming = plan.resume is not None and plan.resume.checkpoint is not None and not dry_run
    resume_run_id = plan.resume.run_id if resuming else None
    if plan.resume is not None and plan.resume.checkpoint is not None and plan.resume.run_id:
        check_reopenable(tracker, plan.resume)  # a dry run too: the run it names must be in this store
    tracker.start(
        cfg, choices=choices, run_dir=run_dir, overrides=list(hydra_cfg.overrides.task),
        resume_run_id=resume_run_id,
        sweep_job=hydra_cfg.job.num if hydra_cfg.mode == RunMode.MULTIRUN else None,
    )
    if not resume_run_id:
        tracker.log_datasets(dataset_refs(plan))
    if resuming:
        mark_resume(tracker, plan, run_dir)
    print(plan.describe(tracker.tracking_uri), flush=True)
    if dry_run:
        if report := plan.trainer_cls.dry_run_report(plan):  # e.g. Miles: the exact command it would launch
            print(report, flush=True)
        apart = " (kept apart from the real runs)" if tracker.experiment != plan.settings.logger.experiment else ""
        print(f"dry run: composed, validated and instantiated; MLflow run {tracker.run_id} "
              f"in experiment {tracker.experiment}{apart}", flush=True)
        tracker.finish()
        return None

    status, stopped = "FAILED", None
    metrics: dict[str, Any] = {}
    trainer: Trainer | None = None
    try:
        trainer = plan.trainer_cls(plan=plan, tracker=tracker)
        metrics = trainer.fit() or {}
        status = "FINISHED"
    except KeyboardInterrupt:  # __main__ ends the process with 130 and no traceback
        status = "KILLED"
        stopped = stopped_line(plan, tracker.run_id, list(hydra_cfg.overrides.task))
        raise
    except (AllGroupsFailing, DependencyLost, engine_unavailable()) as err:
        # The run cannot go on (a dead env server, an engine whose worker died): one line naming it, no traceback.
        raise SystemExit(f"agentrl: {err}") from None
    finally:
        tracker.finish(status)
        print(closing_block(status=status, run_dir=run_dir, tracker=tracker, metrics=metrics,
                            resumable=plan.trainer_cls.checkpoint_kind is not None, stopped=stopped,
                            wall_s=time.monotonic() - started, subset=eval_note(plan)), flush=True)
        if trainer is not None and (notes := trainer.closing_lines()):  # what the trainer saw go wrong
            print("\n".join(notes), flush=True)
    return _value(metrics, "eval/reward")
