"""The model folder a GRPO run starts from: the base model, a given SFT checkpoint, or the recipe's own SFT warm
start (made on demand under `paths.checkpoint_dir/sft`, keyed by its settings, and reused by every run that asks
for the same one).

A warm start made in a run is visible in that run's tracker: its loss curve (`warm_start/loss`), one eval of the
result (`warm_start/eval/*`, played as GRPO plays its evals, its per-task file `evals/warm_start-eval-step-<n>.jsonl`
and its traces; `trainer.warm_start.eval=false` leaves it to the trainer's step-0 eval) and its wall time (`time/warm_start_total_s`). The
tag `agentrl.warm_start` names the folder the run started from, and `agentrl.warm_start.reused` says whether a
cached one was reused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agentrl.config.trainer import SFTTrainerConfig, WarmStartConfig, WarmStartSettings

if TYPE_CHECKING:
    from agentrl.config.schema import RunConfig

PREFIX = "warm_start"  # the warm start's metrics in the GRPO run: warm_start/loss, warm_start/eval/reward, ...


def teacher_setting(trainer: Any) -> tuple[str, str] | None:
    """(config key, teacher) of the demonstrations a run with these `trainer` settings trains on, or None when it
    trains on none."""
    if isinstance(trainer, SFTTrainerConfig):
        return "trainer.teacher", trainer.teacher
    if isinstance(trainer, WarmStartSettings):
        ws = trainer.warm_start
        # null (not yet decided by the plan for this model) may mean on: its teacher must be usable then.
        if ws.enabled is not False and not ws.checkpoint:
            return "trainer.warm_start.teacher", ws.teacher
    return None


def teacher_problem(trainer: Any, bundle: Any) -> str | None:
    """Why the teacher the `trainer` settings name cannot be used with `bundle` (not among `bundle.teachers`), or
    None when it can."""
    setting = teacher_setting(trainer)
    if setting is None:
        return None
    key, teacher = setting
    offered = tuple(bundle.teachers)
    if teacher in offered:
        return None
    if not offered:
        return (f"{key}={teacher}: bundle {bundle.name} offers no teachers (it has no demonstrations); "
                "start from the base model (trainer.warm_start.enabled=false) or a folder of your own "
                "(trainer.warm_start.checkpoint=PATH)")
    return f"{key}={teacher}: bundle {bundle.name} offers the teachers {', '.join(offered)}"


def warm_start_settings(run: RunConfig) -> WarmStartConfig:
    """`trainer.warm_start`: read only under a backend that has one (grpo, trl: `WarmStartSettings`)."""
    return cast(WarmStartSettings, run.trainer).warm_start


def warm_start_path(plan: Any, tracker: Any = None) -> str:
    """The folder training starts from: `trainer.warm_start.checkpoint`, the SFT result (made if missing), or
    the base model (the plan's model source) when the warm start is off. With a tracker, a warm start made here
    is logged to it."""
    from agentrl.models.lora_folder import is_model_folder
    from agentrl.trainers.sft.trainer import role_demonstrations, run_sft, sft_checkpoint_path

    ws = warm_start_settings(plan.settings)
    if not ws.enabled:
        return plan.model.path()
    if ws.checkpoint:
        if not Path(ws.checkpoint).is_dir():
            raise FileNotFoundError(f"trainer.warm_start.checkpoint={ws.checkpoint} does not exist")
        _tag(tracker, ws.checkpoint, reused=True)
        return str(ws.checkpoint)
    path = sft_checkpoint_path(plan.settings, ws, plan.bundle, plan.agent)
    if not is_model_folder(path):
        legacy = sft_checkpoint_path(plan.settings, ws, plan.bundle, plan.agent, legacy=True)
        if is_model_folder(legacy):  # made before the key named the tiny model by its folder name
            path = legacy
    if is_model_folder(path):  # a full model, or under model.lora an adapter folder
        print(f"warm start: reusing {path}", flush=True)
        _tag(tracker, path, reused=True)
        return str(path)
    roles = " role" if role_demonstrations(plan.agent) else ""
    print(f"warm start: SFT on {ws.teacher}{roles} demonstrations for {ws.steps} steps -> {path}", flush=True)
    started = time.monotonic()
    run_sft(plan, path, ws, tracker=tracker, prefix=PREFIX)
    if tracker is not None:
        metrics = _evaluate(plan, path, tracker) if ws.eval else {}
        metrics["time/warm_start_total_s"] = time.monotonic() - started
        tracker.log(metrics, step=ws.steps)
    _tag(tracker, path, reused=False)
    return str(path)


def stopped_sft_step(plan: Any) -> int | None:
    """The step a rerun's SFT (trainer=sft, or the warm start) continues from: a stopped SFT's saved state for the
    folder this plan's SFT writes; None when the plan trains no SFT or none was kept."""
    from agentrl.trainers.sft.state import saved_step, state_dir
    from agentrl.trainers.sft.trainer import sft_checkpoint_path

    run: RunConfig = plan.settings
    t = run.trainer
    if isinstance(t, SFTTrainerConfig):
        out = Path(t.output_dir) if t.output_dir else sft_checkpoint_path(run, t, plan.bundle, plan.agent)
    elif isinstance(t, WarmStartSettings) and t.warm_start.enabled and not t.warm_start.checkpoint:
        out = sft_checkpoint_path(run, t.warm_start, plan.bundle, plan.agent)
    else:
        return None
    return saved_step(state_dir(out))


def _evaluate(plan: Any, path: Path, tracker: Any) -> dict[str, float]:
    """`warm_start/eval/*`: the warm start's model played on the eval split, sampled as the trainer samples; its
    per-task results go to `evals/warm_start-eval-step-<steps>.jsonl` and its plays to the run's traces."""
    from agentrl.play.eval_results import EvalSink
    from agentrl.play.evaluate import evaluate
    from agentrl.play.services import start_services

    run: RunConfig = plan.settings
    services = start_services(plan, str(path))
    services.runner.traces = tracker
    try:
        metrics, _ = evaluate(services, plan.bundle, run.env.eval_split, limit=run.trainer.eval_limit,
                              sampling=plan.sampling, seed_parts=(run.seed, PREFIX), prefix=f"{PREFIX}/eval",
                              step=warm_start_settings(run).steps, sink=EvalSink(tracker, Path(plan.run_dir)))
    finally:
        services.close()
    return metrics


def _tag(tracker: Any, path: str | Path, *, reused: bool) -> None:
    if tracker is not None:
        tracker.set_tags({"agentrl.warm_start": str(path), "agentrl.warm_start.reused": str(reused).lower()})
