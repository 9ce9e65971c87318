"""Registers every schema and every recipe in Hydra's ConfigStore (idempotent)."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from agentrl.config import agent, env, env_mix, inference, logger, model, paths, reward, sandbox, trainer
from agentrl.config.locate import project_root, recipe_dirs
from agentrl.config.schema import RunConfig
from agentrl.config.serve import ServeConfig
from agentrl.config.validate import install_compose_check

# group -> option -> schema. Each conf/<group>/<option>.yaml extends /schema/<group>/<option>.
SCHEMAS: dict[str, dict[str, type]] = {
    "env": {"gridsim": env.GridSimEnvConfig, "arith": env.ArithEnvConfig, "calc": env.CalcEnvConfig,
            "custom": env.EnvConfig,
            "openenv": env.OpenEnvEnvConfig, "reasoning_gym": env.ReasoningGymEnvConfig,
            "textarena": env.TextArenaEnvConfig, "mix": env_mix.MixEnvConfig},
    "agent": {
        "tool_calling": agent.ToolCallingAgentConfig,
        "co_evolution": agent.CoEvolutionAgentConfig,
        "thinker_verifier": agent.ThinkerVerifierAgentConfig,
        "adversarial": agent.AdversarialAgentConfig,
        "self_play": agent.SelfPlayAgentConfig,
    },
    "reward": {
        "env_score": reward.EnvScoreRewardConfig,
        "mean_scores": reward.MeanScoresRewardConfig,
        "asymmetric": reward.AsymmetricRewardConfig,
        "rubric": reward.RubricRewardConfig,
    },
    "trainer": {
        "grpo": trainer.GRPOTrainerConfig,
        "sft": trainer.SFTTrainerConfig,
        "miles": trainer.MilesTrainerConfig,
        "trl": trainer.TRLTrainerConfig,
    },
    "model": {"tiny": model.TinyModelConfig, "hf": model.HFModelConfig, "smollm2": model.SmolLM2ModelConfig},
    "inference": {
        "embedded": inference.EmbeddedInferenceConfig,
        "sglang": inference.SGLangInferenceConfig,
        "vllm": inference.VLLMInferenceConfig,
    },
    "sandbox": {"local": sandbox.LocalSandboxConfig, "docker": sandbox.DockerSandboxConfig},
    "logger": {"mlflow": logger.MLflowLoggerConfig},
    "paths": {"default": paths.PathsConfig},
}

_registered = False


def recipe_files(folders: list[Path] | None = None) -> dict[str, Path]:
    """Recipe name -> its file; a later folder's recipe replaces an earlier one of the same name."""
    return {p.stem: p for folder in (folders or recipe_dirs()) for p in sorted(folder.glob("*.yaml"))}


def recipe_names(folder: Path | None = None) -> list[str]:
    """Names of the recipes that exist (in `folder`, else the shipped and the project's own), sorted."""
    return sorted(recipe_files([folder] if folder else None))


def register_configs() -> None:
    """Store schemas under `schema/<group>` and recipes under group `recipe`; resolvers and the key check too."""
    global _registered
    if _registered:
        return
    install_compose_check()  # `+trainer.lrr=1` fails at compose time, `--cfg job` included
    if not OmegaConf.has_resolver("agentrl_root"):
        OmegaConf.register_new_resolver("agentrl_root", lambda: str(project_root()))
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(name="serve_schema", node=ServeConfig)  # `python -m agentrl.envs.serve` (conf/serve.yaml)
    for group, options in SCHEMAS.items():
        for name, node in options.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
    folders = recipe_dirs()
    if not folders[0].is_dir():
        raise FileNotFoundError(f"agentrl: the recipes folder {folders[0]} is missing; reinstall agentrl")
    for name, path in recipe_files(folders).items():
        # The recipe group must exist wherever agentrl runs: Hydra silently adds a string key for
        # `+recipe=X` when the group is missing from the search path.
        cs.store(group="recipe", name=name, node=OmegaConf.load(path), package="_global_")
    _registered = True
