"""Numeric config keys out of range (NaN, infinite, zero, negative, the wrong type) fail when the settings are built,
naming the key (agentrl/config/numbers.py): every trainer, the env server, the engines, the tiny model, the Docker
sandbox, the reward and eval, and through the plan."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from agentrl.config.env import EnvServerConfig, OpenEnvEnvConfig, ReasoningGymEnvConfig
from agentrl.config.evaluation import EvalConfig
from agentrl.config.inference import EmbeddedInferenceConfig, SGLangInferenceConfig, VLLMInferenceConfig
from agentrl.config.model import TinyModelConfig
from agentrl.config.reward import AsymmetricRewardConfig
from agentrl.config.sandbox import DockerSandboxConfig
from agentrl.config.trainer import (
    GRPOTrainerConfig,
    MilesTrainerConfig,
    SFTTrainerConfig,
    TRLTrainerConfig,
    WarmStartConfig,
)
from agentrl.plan import PlanError, build_plan
from agentrl.testing.config import compose_config

NAN, INF = math.nan, math.inf
TRAINERS = (GRPOTrainerConfig, SFTTrainerConfig, TRLTrainerConfig, MilesTrainerConfig)


@pytest.mark.parametrize("schema", TRAINERS)
@pytest.mark.parametrize(("fields", "message"), [
    ({"lr": NAN}, "trainer.lr must be a finite number > 0, got nan"),
    ({"lr": INF}, "trainer.lr must be a finite number > 0, got inf"),
    ({"lr": 0.0}, "trainer.lr must be a finite number > 0"),
    ({"lr": "fast"}, "trainer.lr must be a finite number > 0, got 'fast'"),
    ({"steps": 0}, "trainer.steps must be an integer >= 1, got 0"),
    ({"steps": True}, "trainer.steps must be an integer >= 1, got True"),
    ({"keep_checkpoints": 0}, "trainer.keep_checkpoints must be an integer >= 1"),
    ({"eval_every": -1}, "trainer.eval_every must be an integer >= 0 (0: only before and after training)"),
    ({"checkpoint_every": -1}, "trainer.checkpoint_every must be an integer >= 0 (0: never)"),
    ({"eval_limit": 0}, "trainer.eval_limit must be an integer >= 1 (or null: the whole eval split)"),
])
def test_every_trainer_refuses_a_bad_common_key(schema: type, fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        schema(**fields)


@pytest.mark.parametrize(("schema", "fields", "message"), [
    (GRPOTrainerConfig, {"samples_per_prompt": 0}, "trainer.samples_per_prompt must be an integer >= 1"),
    (GRPOTrainerConfig, {"prompts_per_step": -2}, "trainer.prompts_per_step must be an integer >= 1"),
    (GRPOTrainerConfig, {"micro_batch_samples": 0}, "trainer.micro_batch_samples must be an integer >= 1"),
    (GRPOTrainerConfig, {"grad_clip": NAN}, "trainer.grad_clip must be a finite number > 0"),
    (GRPOTrainerConfig, {"weight_decay": -0.1}, "trainer.weight_decay must be a finite number >= 0"),
    (GRPOTrainerConfig, {"max_extra_rows": -1}, "trainer.max_extra_rows must be an integer >= 0"),
    (GRPOTrainerConfig, {"kl_coef": NAN}, "trainer.kl_coef must be >= 0"),
    (GRPOTrainerConfig, {"entropy_coef": INF}, "trainer.entropy_coef must be >= 0"),
    (GRPOTrainerConfig, {"tis_cap": NAN}, "trainer.tis_cap=nan: the truncation cap must be >= 1"),
    (GRPOTrainerConfig, {"clip_high": NAN}, "trainer.clip_high must be >= 0"),
    (TRLTrainerConfig, {"num_processes": 0}, "trainer.num_processes must be an integer >= 1"),
    (TRLTrainerConfig, {"grad_clip": -1.0}, "trainer.grad_clip must be a finite number > 0"),
    (TRLTrainerConfig, {"main_process_port": 65536}, "trainer.main_process_port must be a port"),
    (SFTTrainerConfig, {"batch_samples": 0}, "trainer.batch_samples must be an integer >= 1"),
    (SFTTrainerConfig, {"generated": -5}, "trainer.generated must be an integer >= 0"),
    (MilesTrainerConfig, {"tensor_parallel": 0}, "trainer.tensor_parallel must be an integer >= 1"),
    (WarmStartConfig, {"lr": INF}, "trainer.warm_start.lr must be a finite number > 0, got inf"),
    (WarmStartConfig, {"steps": 0}, "trainer.warm_start.steps must be an integer >= 1"),
    (WarmStartConfig, {"batch_samples": 0}, "trainer.warm_start.batch_samples must be an integer >= 1"),
    (WarmStartConfig, {"warmup_steps": -1}, "trainer.warm_start.warmup_steps must be an integer >= 0"),
    (AsymmetricRewardConfig, {"correct_weight": NAN}, "reward.correct_weight must be a finite number >= 0"),
    (AsymmetricRewardConfig, {"correct_threshold": INF}, "reward.correct_threshold must be a finite number"),
    (EvalConfig, {"temperature": NAN}, "eval.temperature must be a finite number >= 0"),
    (EvalConfig, {"pass_score": INF}, "eval.pass_score must be a finite number"),
    (EnvServerConfig, {"max_concurrent_envs": 0}, "env.server.max_concurrent_envs must be an integer >= 1"),
    (EnvServerConfig, {"tool_timeout": NAN}, "env.server.tool_timeout must be a finite number > 0"),
    (EnvServerConfig, {"connect_timeout": -1.0}, "env.server.connect_timeout must be a finite number > 0"),
    (EnvServerConfig, {"port": 70000}, "env.server.port must be a port from 1 to 65535 (0: a free one)"),
    (OpenEnvEnvConfig, {"step_timeout": NAN}, "env.step_timeout must be a finite number > 0, got nan"),
    (ReasoningGymEnvConfig, {"curriculum_threshold": NAN}, "env.curriculum_threshold must be a finite number >= 0"),
    (EmbeddedInferenceConfig, {"max_batch_sequences": 0}, "inference.max_batch_sequences must be an integer >= 1"),
    (EmbeddedInferenceConfig, {"batch_wait_ms": NAN}, "inference.batch_wait_ms must be a finite number >= 0"),
    (EmbeddedInferenceConfig, {"max_body_bytes": 0}, "inference.max_body_bytes must be an integer >= 1"),
    (SGLangInferenceConfig, {"mem_fraction_static": 1.5}, "inference.mem_fraction_static must be in (0, 1]"),
    (SGLangInferenceConfig, {"request_timeout": INF}, "inference.request_timeout must be a finite number > 0"),
    (VLLMInferenceConfig, {"max_model_len": 0}, "inference.max_model_len must be an integer >= 1"),
    (VLLMInferenceConfig, {"base_port": -1}, "inference.base_port must be a port"),
    (VLLMInferenceConfig, {"health_every_s": NAN}, "inference.health_every_s must be a finite number > 0"),
    (TinyModelConfig, {"hidden_size": 0}, "model.hidden_size must be an integer >= 1"),
    (TinyModelConfig, {"dtype": "float8"}, "model.dtype='float8'"),  # the base schema's checks still run
    (DockerSandboxConfig, {"cpus": NAN}, "sandbox.cpus must be a finite number > 0"),
    (DockerSandboxConfig, {"warm_pool": -1}, "sandbox.warm_pool must be an integer >= 0"),
])
def test_each_trainer_refuses_its_own_bad_keys(schema: type, fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        schema(**fields)


def _given(instance: object, fields: dict) -> dict:
    return {name: getattr(instance, name) for name in fields}


def test_the_defaults_and_the_documented_zeros_pass() -> None:
    # Each schema's defaults pass its checks, which keep them as declared.
    for schema in (*TRAINERS, WarmStartConfig, AsymmetricRewardConfig, EvalConfig, EnvServerConfig,
                   EmbeddedInferenceConfig, SGLangInferenceConfig, VLLMInferenceConfig, DockerSandboxConfig):
        declared = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(schema) if f.init}
        assert _given(schema(), declared) == declared, schema.__name__
    assert TinyModelConfig(path="/m").path == "/m"
    # The zeros (and None) the docs name as "off" pass too, kept as given.
    zeros = {"eval_every": 0, "checkpoint_every": 0, "max_extra_rows": 0, "threads": 0, "weight_decay": 0.0,
             "eval_limit": None, "kl_coef": 0.0, "tis_cap": 0.0, "tis_mode": "ignore"}
    assert _given(GRPOTrainerConfig(**zeros), zeros) == zeros
    warm_zeros = {"warmup_steps": 0, "augment": 0, "generated": 0}
    assert _given(WarmStartConfig(**warm_zeros), warm_zeros) == warm_zeros


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.lr=nan", "trainer.lr must be a finite number > 0, got nan"),
    ("trainer.samples_per_prompt=0", "trainer.samples_per_prompt must be an integer >= 1, got 0"),
    ("trainer.warm_start.lr=inf", "trainer.warm_start.lr must be a finite number > 0, got inf"),
])
def test_a_bad_number_fails_when_the_plan_is_built(override: str, message: str, tmp_path: Path) -> None:
    cfg = compose_config("+recipe=gridsim_grpo", override)
    with pytest.raises(PlanError, match=message):
        build_plan(cfg, choices={}, run_dir=tmp_path)
