"""The root schema: top-level keys are typed; each group's node is typed by its option's own schema."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from agentrl.config.evaluation import EvalConfig


@dataclass
class RunConfig:
    env: Any = MISSING
    agent: Any = MISSING
    reward: Any = MISSING
    trainer: Any = MISSING
    model: Any = MISSING
    inference: Any = MISSING
    sandbox: Any = MISSING
    logger: Any = MISSING
    paths: Any = MISSING
    # Set by +recipe=NAME; a recipe that Hydra could not find would leave a plain string here.
    recipe: Any = None
    hparams_search: Any = None
    task_name: str = "train"
    # One or two sentences on what the run is for; recipes set it; MLflow shows it as the run's description.
    description: str | None = None
    seed: int = 0
    # Compose, validate, instantiate and print the plan; train nothing.
    dry_run: bool = False
    # What `python -m agentrl eval` plays (agentrl/config/evaluation.py); a training run ignores it.
    eval: EvalConfig = field(default_factory=EvalConfig)


def settings_dict(settings: RunConfig) -> dict[str, Any]:
    """The typed settings (`Plan.settings`) as plain data, interpolations already resolved: the one way the whole
    config is recorded or sent (a checkpoint's record, the config a resumed run logs, a TRL rank's portable spec).
    Equal to the composed config's `OmegaConf.to_container(cfg, resolve=True)`, so records written from either
    compare alike."""
    return dataclasses.asdict(settings)
