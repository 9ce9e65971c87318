"""Turns a composed config into the run's objects: env bundle, agent, reward, trainer (and what they use)."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from agentrl.config.inference import SGLangInferenceConfig
from agentrl.config.locate import project_root, project_root_reason, recipe_dirs
from agentrl.config.schema import RunConfig
from agentrl.config.trainer import MilesTrainerConfig
from agentrl.tracking.tracker import Tracker

if TYPE_CHECKING:
    from agentrl.config.logger import MLflowLoggerConfig
    from agentrl.config.model import LoraConfig
    from agentrl.trainers.common.protocol import Trainer

# Every _target_ a config may name lives here; Hydra 1.4 will want exactly this whitelist.
TARGET_PREFIX = "agentrl."


class PlanError(ValueError):
    """The composed config names something that cannot be built."""


def import_target(node: DictConfig, where: str) -> Any:
    """Import `node._target_`, which must live under agentrl.*."""
    target = node.get("_target_")
    if not isinstance(target, str) or not target.startswith(TARGET_PREFIX):
        raise PlanError(f"{where}._target_ must name something under {TARGET_PREFIX}*, got {target!r}")
    module_name, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PlanError(f"{where}._target_={target} cannot be imported: {exc}") from exc


def resolve_target(node: DictConfig, where: str) -> Any:
    """Import `node._target_` and check that its signature accepts the node's other keys."""
    obj = import_target(node, where)
    container = cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))  # a DictConfig's: a dict
    kwargs = {k: v for k, v in container.items() if k != "_target_"}
    try:
        inspect.signature(obj).bind(**kwargs)
    except TypeError as exc:
        raise PlanError(f"{where}: {node._target_} does not accept the config's keys: {exc}") from exc
    return obj


def resolve_nested(node: Any, where: str) -> None:
    """`resolve_target` for every `_target_` node below `node` (e.g. reward=rubric's tree), naming its key."""
    items: Iterable[tuple[Any, Any]] = \
        node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node)
    for key, child in items:
        if key == "_target_" or not isinstance(child, (DictConfig, ListConfig)) or child._is_none():
            continue  # a null node (e.g. env=openenv's env.tools: null) holds nothing to build
        path = f"{where}[{key}]" if isinstance(node, ListConfig) else f"{where}.{key}"
        if isinstance(child, DictConfig) and "_target_" in child:
            resolve_target(child, path)
        resolve_nested(child, path)


def build(node: DictConfig, where: str, **extra: Any) -> Any:
    """Instantiate a group's object (`extra`: arguments the config does not hold); a value its own checks refuse
    is a PlanError naming the group (and the nested node's key, for a node below it)."""
    resolve_target(node, where)
    resolve_nested(node, where)
    try:
        return instantiate(node, **extra)
    except Exception as exc:  # noqa: BLE001 - Hydra wraps the object's own error; say it with the group
        cause = exc.__cause__ or exc
        nested = re.search(r"full_key: (\S+)", str(exc))
        raise PlanError(f"{nested.group(1) if nested else where}: {type(cause).__name__}: {cause}") from exc


@dataclass(eq=False)
class ModelSource:
    """The `model` group: where the base model's folder is (`path()` makes it first when its factory builds on
    demand, e.g. the tiny model)."""

    node: DictConfig

    def path(self) -> str:
        """The base model's folder, made now if it must be."""
        made = build(self.node, "model")
        return made if isinstance(made, str) else str(self.node.path)


@dataclass(eq=False)
class EngineFactory:
    """The `inference` group: makes the engine that serves a given weights folder (one per policy)."""

    node: DictConfig
    # model.lora when the learner pushes adapters (push=adapter): a server engine then launches able to load them.
    lora: Any = None

    def __call__(self, model_path: str) -> Any:
        """A new engine serving the model at `model_path`."""
        if self.lora is None:
            return instantiate(self.node, model_path=model_path)
        # As a partial, so the engine gets the typed LoraConfig itself (instantiate would make kwargs a DictConfig).
        return instantiate(self.node, model_path=model_path, _partial_=True)(lora=self.lora)

    def on_device(self, device: str) -> EngineFactory:
        """This factory with its engines on `device` (a TRL rank's engine beside its own learner's GPU)."""
        node = self.node.copy()
        node.device = device
        return EngineFactory(node, self.lora)


@dataclass
class Plan:
    """Everything a trainer needs, built from one config. It holds no `DictConfig`: below the plan, code reads
    `settings` (the typed config) and the objects built here."""

    choices: dict[str, str | None]
    run_dir: Path
    bundle: Any
    agent: Any
    reward: Any
    trainer_cls: type[Trainer]
    # The typed config (`RunConfig`, each group its option's schema dataclass): what code below the plan reads,
    # instead of the raw DictConfig and its casts.
    settings: RunConfig
    notes: list[str] = field(default_factory=list)
    resume: Any = None  # trainers.common.resume.ResumeTarget: the checkpoint trainer.resume names, checked (None: fresh)
    model: ModelSource | None = None  # the base model (`model` group)
    engine_factory: EngineFactory | None = None  # model folder -> inference engine (`inference` group)
    tracker: Tracker | None = None  # the run's tracking (`logger` group); None for a plan built to check only
    # How rollouts and sampled evals sample (`config.sampling.Sampling`, from the trainer's settings; None: the
    # trainer samples nothing): training, evals and the warm start's eval send its request kwargs.
    sampling: Any = None

    def describe(self, tracking_uri: str | None = None) -> str:
        """A human-readable plan of the run."""
        from agentrl.devices import describe_threads  # torch loads only once a plan is built
        s = self.settings
        splits = ", ".join(f"{k}={v}" for k, v in self.bundle.splits().items())
        lines = [
            f"recipe     {self.choices.get('recipe') or '(none: the defaults)'}",
            f"env        {self.choices.get('env')}: bundle {self.bundle.name} v{self.bundle.version} ({splits}); "
            f"train split {s.env.train_split}, eval split {s.env.eval_split}",
            f"server     {s.env.server.url or 'started for this run on ' + s.env.server.host}"
            f"{' in a process of its own (env.server.process)' if s.env.server.process else ''}, "
            f"max_concurrent_envs={s.env.server.max_concurrent_envs}, sandbox {s.sandbox.kind}",
            f"agent      {self.choices.get('agent')}: {type(self.agent).__name__} (max_turns={s.agent.max_turns})",
            f"reward     {self.choices.get('reward')}: {self.reward!r}",
            f"trainer    {self.choices.get('trainer')}: {self.trainer_cls.__module__}.{self.trainer_cls.__name__}",
            f"model      {self.choices.get('model')}: {s.model.path}",
            f"inference  {self.choices.get('inference')}: {s.inference._target_}",
            f"stages     {describe_stages(s, self.choices.get('trainer'))}",
            f"threads    {describe_threads(self.settings)}",
            f"outputs    {self.run_dir}",
            f"root       {project_root()} ({project_root_reason()}); recipes from {', '.join(map(str, recipe_dirs()))}",
        ]
        if self.resume is not None:
            lines.append(f"resume     {self.resume.describe()}")
        if tracking_uri:
            logger = cast("MLflowLoggerConfig", self.settings.logger)  # a tracking URI: MLflow's tracker logs
            lines.append(f"metrics    MLflow {tracking_uri} (experiment {logger.experiment})")
        lines += [f"note       {n}" for n in self.notes]
        return "\n".join(lines)


def describe_stages(settings: RunConfig, trainer_choice: str | None) -> str:
    """The plan's `stages` line: what will run, in order, the warm start (or why none) included."""
    from agentrl.config.trainer import WarmStartSettings

    t = settings.trainer
    parts = []
    if isinstance(t, WarmStartSettings):
        ws = t.warm_start
        if ws.checkpoint:
            parts.append(f"start from {ws.checkpoint} (trainer.warm_start.checkpoint)")
        elif ws.enabled:
            parts.append(f"warm start: SFT on {ws.teacher} demonstrations, {ws.steps} steps at lr {ws.lr:g} "
                         f"(made on first use, then reused{', then evaluated' if ws.eval else ''})")
        else:
            from agentrl.config.model import TinyModelConfig

            why = "off" if isinstance(settings.model, TinyModelConfig) else \
                "a pretrained model starts from itself; trainer.warm_start.enabled=true runs one"
            parts.append(f"no warm start ({why})")
    knobs = vars(t)  # the trainer's typed settings: the keys its schema declares (Miles has no eval_every)
    steps, every, limit = knobs.get("steps"), knobs.get("eval_every"), knobs.get("eval_limit")
    run = f"{trainer_choice or 'trainer'}{f' {steps} steps' if steps else ''}"
    if every is not None:
        run += f", eval {'every ' + str(every) + ' steps' if every else 'before and after'}" \
               f" on {limit if limit else 'all'} {settings.env.eval_split} tasks"
    return " -> ".join([*parts, run])


MISSING_MODEL_PATH = ("model.path is not set: model=hf needs a local Hugging Face folder, e.g. model=hf "
                      "model.path=/data/Qwen3-4B (docs/models.md)")


def check_model(cfg: DictConfig) -> list[str]:
    """The model group's checks, before anything starts: a path is given, the factory accepts the keys, a folder
    that must exist is a usable model (`model=hf`), and its chat template gives an assistant mask and writes tool
    calls `model.tool_format` reads (`inference.assistant_tokens`). Returns the plan's notes about the model."""
    if OmegaConf.is_missing(cfg.model, "path"):
        raise PlanError(MISSING_MODEL_PATH)
    factory = resolve_target(cfg.model, "model")
    lora = cfg.model.get("lora")
    if getattr(factory, "builds_on_demand", False) and not (Path(cfg.model.path) / "config.json").is_file() \
            and not (lora is not None and lora.enabled):  # LoRA's check needs the model: it is made now
        return []  # e.g. the tiny model, made (with agentrl's own template) when first used
    path = build(cfg.model, "model")
    from transformers import AutoTokenizer

    from agentrl.inference.assistant_tokens import TemplateError, check_chat_template

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        notes = [check_chat_template(tokenizer, str(cfg.model.tool_format))]
    except TemplateError as exc:
        raise PlanError(f"model.path={path}: {exc} (docs/models.md, \"The chat template\")") from exc
    if lora is not None and lora.enabled:
        from agentrl.trainers.common.lora import plan_note  # torch loads only once a plan is built

        try:
            notes.append(plan_note(path, cast("LoraConfig", OmegaConf.to_object(lora))))
        except ValueError as exc:
            raise PlanError(f"model.path={path}: {exc}") from exc
    return notes


def build_plan(cfg: DictConfig, *, choices: dict[str, str | None], run_dir: Path, tracked: bool = False) -> Plan:
    """Instantiate the cheap objects (bundle, agent, reward; the tracker when `tracked`) and resolve the heavy ones
    (trainer, model, engine: a `ModelSource` and an `EngineFactory` make them when the trainer asks)."""
    # The schemas' own checks (__post_init__: a key's range, trainer.loss and its companions, a choice Miles
    # cannot apply) run on the composed values first (Hydra's overrides never construct the dataclass), so a bad
    # number is refused naming its key before a bundle or agent is built with it.
    try:
        settings = typed_settings(cfg)
        sampling = settings.trainer.sampling()
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    bundle, agent, reward = (build(cfg[group], group) for group in ("env", "agent", "reward"))
    # Trainers are constructed by run.py with the whole plan, so only their class is resolved here; the model
    # and the engine are made by the trainer, but a key their factories do not take fails now.
    trainer_cls = import_target(cfg.trainer, "trainer")
    from agentrl.trainers.common.protocol import missing_members  # torch loads only once a plan is built

    if missing := missing_members(trainer_cls):
        raise PlanError(f"trainer._target_={cfg.trainer._target_} is not a trainer: it lacks {', '.join(missing)} "
                        "(agentrl.trainers.common.protocol.Trainer; inherit TrainerBase for the defaults)")
    # A backend's own refusals (e.g. a setting TRL lacks) fail here too, before anything starts.
    if problem := trainer_cls.plan_problem(settings):
        raise PlanError(problem)
    # Miles reads model.path on its own (GPU) machines and checks it there (`MilesTrainer.preflight`): a dry run
    # on a laptop must still print the command.
    notes = [] if trainer_cls.checks_model_itself else check_model(cfg)
    from agentrl.play.policies import plan_policies

    try:  # a role's own model (agent.roles.<i>.model) that is not there fails now, not when training starts
        if not trainer_cls.checks_model_itself:  # (Miles: on its own machines, as model.path)
            plan_policies(settings.agent.role_list())
    except FileNotFoundError as exc:
        raise PlanError(str(exc)) from exc
    resolve_target(cfg.inference, "inference")
    # SGLang needs a GPU: the command our engine would launch is shown (Miles launches its own: its report says).
    if isinstance(settings.inference, SGLangInferenceConfig) and not isinstance(settings.trainer, MilesTrainerConfig):
        from agentrl.inference.engines.sglang import launch_note

        notes += [n for n in [launch_note(settings)] if n]
    from agentrl.devices import DeviceError, check_devices  # torch loads only once a plan is built

    try:
        check_devices(settings)
    except DeviceError as exc:
        raise PlanError(str(exc)) from exc
    # An agent that cannot play this bundle says why now (agent=self_play: fewer roles than the game's seats).
    if callable(check := getattr(agent, "plan_problem", None)) and (problem := check(bundle)):
        raise PlanError(problem)
    # A reward that names a score the bundle declares it never gives (reward=rubric's Score nodes) fails now.
    if callable(check := getattr(reward, "plan_problem", None)) and (problem := check(bundle)):
        raise PlanError(problem)
    for split in (settings.env.train_split, settings.env.eval_split):
        if split not in bundle.splits():
            raise PlanError(f"env: bundle {bundle.name} has no split {split!r}; it has {sorted(bundle.splits())}")
    # A teacher the bundle does not offer fails here, before any model is made or trained.
    from agentrl.trainers.sft.warm_start import teacher_problem

    if problem := teacher_problem(settings.trainer, bundle):
        raise PlanError(problem)
    if note := lora_warm_start_note(settings):
        notes.append(note)
    resume = plan_resume(settings, choices, trainer_cls)
    # Last: an MLflow store is opened only for a config that passed every check above.
    tracker = build(cfg.logger, "logger", output_root=settings.paths.output_root) if tracked else None
    return Plan(choices, run_dir, bundle, agent, reward, trainer_cls, notes=notes, resume=resume,
                settings=settings, sampling=sampling, model=ModelSource(cfg.model),
                engine_factory=EngineFactory(cfg.inference, adapter_lora(settings)), tracker=tracker)


def adapter_lora(settings: RunConfig) -> Any:
    """`model.lora` when the engines get adapters pushed (enabled, push=adapter), else None."""
    lora = settings.model.lora
    return lora if lora.enabled and lora.push == "adapter" else None


def typed_settings(cfg: DictConfig) -> RunConfig:
    """The whole config as its schema dataclasses (`RunConfig`), interpolations resolved; a required value left
    unset (`???`) is a PlanError naming its key."""
    resolve_warm_start(cfg)
    try:
        return cast(RunConfig, OmegaConf.to_object(cfg))  # the root schema (register.py: run_schema)
    except MissingMandatoryValue as exc:
        key = getattr(exc, "full_key", None) or "a required value"
        if key == "model.path":
            raise PlanError(MISSING_MODEL_PATH) from None
        raise PlanError(f"{key} is not set: it has no default; set it, e.g. {key}=...") from None


def lora_warm_start_note(settings: RunConfig) -> str | None:
    """The plan's warning when an SFT warm start made on demand would train only a LoRA adapter: at a full
    fine-tuning rate it teaches little (calc_smollm2 with model.lora: a warm start that taught no tool call)."""
    from agentrl.config.trainer import WarmStartSettings

    t = settings.trainer
    if not (settings.model.lora.enabled and isinstance(t, WarmStartSettings)):
        return None
    ws = t.warm_start
    if not ws.enabled or ws.checkpoint:
        return None
    return (f"the warm start trains only the LoRA adapter ({ws.steps} SFT steps at trainer.warm_start.lr={ws.lr:g}); "
            "an adapter usually needs ~10x a full fine-tuning rate. docs/models.md, \"LoRA\": warm-start the whole "
            "model (without model.lora), then give its folder as trainer.warm_start.checkpoint")


def resolve_warm_start(cfg: DictConfig) -> None:
    """`trainer.warm_start.enabled=null` (the default) decided in the composed config itself (so the typed
    settings, checkpoint records and the config a TRL rank gets all agree): on for a model made from scratch (the
    tiny model, which knows nothing before it), off for a pretrained model, which starts from itself."""
    from omegaconf import read_write

    from agentrl.config.model import TinyModelConfig

    ws = OmegaConf.select(cfg, "trainer.warm_start")
    if ws is None or ws.get("enabled") is not None:
        return
    model_type = OmegaConf.get_type(cfg.model) if "model" in cfg else None
    with read_write(ws):
        ws.enabled = isinstance(model_type, type) and issubclass(model_type, TinyModelConfig)


def plan_resume(settings: RunConfig, choices: dict[str, str | None], trainer_cls: type[Trainer]) -> Any:
    """What `trainer.resume` resumes, checked against the checkpoint's config (None: a fresh start)."""
    from agentrl.trainers.common.resume import ResumeError, resolve_resume, resume_mode

    asked = resume_mode(settings.trainer.resume)
    if asked is None:
        return None
    kind = trainer_cls.checkpoint_kind
    if kind is None:
        if asked == "latest" and trainer_cls.resumes_itself:
            return None  # e.g. Miles: its own --load of its save folder
        raise PlanError(f"trainer.resume={asked}: trainer {choices.get('trainer') or trainer_cls.__name__} does not "
                        "resume (the built-in grpo and trl do; miles takes trainer.resume=latest only)")
    try:
        return resolve_resume(settings, choices, kind)
    except ResumeError as exc:
        raise PlanError(str(exc)) from exc
