"""One Hydra job: check the composition, build the plan, open tracking, train, return the objective."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from agentrl.config.register import recipe_names
from agentrl.plan import PlanError, build_plan

log = logging.getLogger("agentrl")


class RecipeNotFound(SystemExit):
    """`+recipe=NAME` named no recipe (Hydra would otherwise silently run the defaults)."""


def check_recipe(cfg: DictConfig) -> None:
    """Refuse a `recipe` key that is a plain string: the recipe group was not found, nothing was applied."""
    if isinstance(cfg.get("recipe"), str):
        raise RecipeNotFound(
            f"agentrl: unknown recipe {cfg.recipe!r}; the recipes are: {', '.join(recipe_names())}"
        )


def run(cfg: DictConfig) -> float | None:
    """Run one job; return its final eval/reward (the objective a sweeper maximizes), None for a dry run."""
    check_recipe(cfg)
    # One INFO line per request (every chat turn, every session) would drown the progress bars.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    hydra_cfg = HydraConfig.get()
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith(("hydra/", "schema/"))}
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        plan = build_plan(cfg, choices=choices, run_dir=run_dir)
    except PlanError as err:
        raise SystemExit(f"agentrl: {err}") from None

    tracker = instantiate(cfg.logger, output_root=cfg.paths.output_root)
    resume_run_id = None
    if cfg.trainer.get("resume") and hasattr(plan.trainer_cls, "resume_run_id"):
        resume_run_id = plan.trainer_cls.resume_run_id(cfg)
    tracker.start(
        cfg, choices=choices, run_dir=run_dir, overrides=list(hydra_cfg.overrides.task),
        resume_run_id=resume_run_id,
    )
    print(plan.describe(tracker.tracking_uri), flush=True)
    if cfg.dry_run:
        if hasattr(plan.trainer_cls, "dry_run_report"):  # e.g. Miles: the exact command it would launch
            print(plan.trainer_cls.dry_run_report(cfg, plan), flush=True)
        print(f"dry run: composed, validated and instantiated; MLflow run {tracker.run_id}", flush=True)
        tracker.finish()
        return None

    status = "FAILED"
    try:
        trainer = plan.trainer_cls(cfg, plan=plan, tracker=tracker)
        metrics = trainer.fit()
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.finish(status)
    objective = metrics.get("eval/reward")
    log.info("final eval/reward: %s", objective)
    return objective
