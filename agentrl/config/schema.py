"""The root schema: top-level keys are typed; each group's node is typed by its option's own schema."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from omegaconf import MISSING

from agentrl.config.evaluation import EvalConfig

if TYPE_CHECKING:
    # For the type checker, each group is its options' common base schema (every option's schema subclasses it:
    # register.SCHEMAS). At run time the fields stay Any: OmegaConf types a node by its field's annotation, and
    # each group's node must be typed by its own option's schema, not the base.
    from agentrl.config.agent import AgentConfig as AgentSettings
    from agentrl.config.env import EnvConfig as EnvSettings
    from agentrl.config.inference import InferenceConfig as InferenceSettings
    from agentrl.config.logger import LoggerConfig as LoggerSettings
    from agentrl.config.model import ModelConfig as ModelSettings
    from agentrl.config.paths import PathsConfig as PathsSettings
    from agentrl.config.reward import RewardConfig as RewardSettings
    from agentrl.config.sandbox import SandboxConfig as SandboxSettings
    from agentrl.config.trainer import TrainerConfig as TrainerSettings
else:
    AgentSettings = EnvSettings = InferenceSettings = LoggerSettings = ModelSettings = PathsSettings = \
        RewardSettings = SandboxSettings = TrainerSettings = Any

TrainerSchema = TypeVar("TrainerSchema", bound="TrainerSettings")


@dataclass
class RunConfig:
    env: EnvSettings = MISSING
    agent: AgentSettings = MISSING
    reward: RewardSettings = MISSING
    trainer: TrainerSettings = MISSING
    model: ModelSettings = MISSING
    inference: InferenceSettings = MISSING
    sandbox: SandboxSettings = MISSING
    logger: LoggerSettings = MISSING
    paths: PathsSettings = MISSING
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


def trainer_settings(settings: RunConfig, schema: type[TrainerSchema]) -> TrainerSchema:
    """`settings.trainer` typed as `schema`, the options schema of the backend that reads it (the plan built
    that backend from the same `trainer` choice, so the node is that schema). For the type checker only:
    nothing is checked at run time. `RunConfig.trainer` is typed as the base `TrainerConfig`, which lacks each
    backend's own keys."""
    return cast(TrainerSchema, settings.trainer)
