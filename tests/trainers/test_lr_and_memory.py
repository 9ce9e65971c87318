"""The RL stage's learning-rate schedule (grpo and trl), gradient checkpointing and model.dtype, on a real tiny
model: the rate the optimizer holds at each step, and the update checkpointing computes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from agentrl.config.model import ModelConfig
from agentrl.play.policies import Policy
from agentrl.trainers.common.trained_model import checkpointing
from agentrl.trainers.grpo.learner import TrainItem
from agentrl.trainers.grpo.lr_schedules import lr_factor
from agentrl.trainers.grpo.policy_steps import load_learners, step_policies


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from agentrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(str(tmp_path_factory.mktemp("m") / "tiny"), seed=5, vocab_size=512, hidden_size=32,
                             num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                             max_position_embeddings=128)


def trainer_cfg(**over: object) -> object:
    from agentrl.config.trainer import GRPOTrainerConfig

    return OmegaConf.merge(OmegaConf.structured(GRPOTrainerConfig), {
        "lr": 0.01, "steps": 6, "micro_batch_samples": 4, "temperature": 1.0, "overlong_max_tokens": None, **over})


def played() -> list:
    """Four samples of one group sharing a 20-token prompt (long enough for the learner's shared prefix)."""
    prompt = list(range(10, 30))
    out = []
    for i in range(4):
        reply = [40 + i, 50 + i, 60, 2]
        sample = SimpleNamespace(token_ids=prompt + reply, loss_mask=[0] * 20 + [1] * 4,
                                 rollout_logprobs=[0.0] * 20 + [-6.0] * 4)
        out.append(SimpleNamespace(reward=float(i), group=("train", 0), sample=sample, frozen=False, policy="main"))
    return out


def test_the_factor_warms_up_then_follows_the_schedule():
    assert [lr_factor(s, 6, 2, "constant") for s in range(1, 7)] == [0.5, 1, 1, 1, 1, 1]
    assert [lr_factor(s, 6, 2, "linear") for s in range(1, 7)] == [0.5, 1, 1, 0.75, 0.5, 0.25]
    cosine = [lr_factor(s, 6, 0, "cosine") for s in range(1, 7)]
    assert cosine[0] == 1 and all(a > b for a, b in zip(cosine, cosine[1:], strict=False)) and cosine[-1] > 0
    assert [lr_factor(s, 3) for s in (1, 2, 3)] == [1, 1, 1]  # the default: what GRPO always trained with
    with pytest.raises(ValueError, match="trainer.lr_schedule='step': choose one of constant, linear, cosine"):
        lr_factor(1, 3, 0, "step")


def test_the_schema_refuses_a_bad_schedule_naming_the_key():
    with pytest.raises(ValueError, match="trainer.lr_schedule='exp'"):
        OmegaConf.to_object(trainer_cfg(lr_schedule="exp"))
    with pytest.raises(ValueError, match="trainer.lr_warmup_steps must be >= 0"):
        OmegaConf.to_object(trainer_cfg(lr_warmup_steps=-1))


def test_each_grpo_step_trains_at_its_scheduled_rate(tiny_model: str):
    t = trainer_cfg(lr_warmup_steps=2, lr_schedule="linear")
    policies = [Policy("main", tiny_model, trainable=True, path=tiny_model)]
    load_learners(t, policies, model_cfg=ModelConfig())
    opt = policies[0].learner.optimizer
    engines = {"main": SimpleNamespace(update_weights=lambda state: None)}
    seen = []
    for step in range(1, 7):
        metrics, _ = step_policies(policies, played(), engines, step)
        seen.append((metrics["train/lr"], [g["lr"] for g in opt.param_groups][0]))
        assert metrics["train/tokens"] == 16
    expected = [0.005, 0.01, 0.01, 0.0075, 0.005, 0.0025]
    assert [logged for logged, _ in seen] == pytest.approx(expected)
    assert [held for _, held in seen] == pytest.approx(expected)


def one_update(path: str, model_cfg: dict) -> tuple[torch.nn.Module, dict, list[torch.Tensor]]:
    policies = [Policy("main", path, trainable=True, path=path)]
    load_learners(trainer_cfg(), policies, model_cfg=ModelConfig(**model_cfg))
    learner = policies[0].learner
    items = [TrainItem(p.sample.token_ids, p.sample.loss_mask, p.sample.rollout_logprobs, a)
             for p, a in zip(played(), [-1.5, -0.5, 0.5, 1.5], strict=True)]
    before = [p.detach().clone() for p in learner.model.parameters()]
    metrics = learner.step(items)
    return learner.model, metrics, [p.detach() - b for p, b in zip(learner.model.parameters(), before, strict=True)]


def test_gradient_checkpointing_is_on_and_makes_the_same_update(tiny_model: str):
    plain, plain_metrics, plain_delta = one_update(tiny_model, {"gradient_checkpointing": False})
    ckpt, ckpt_metrics, ckpt_delta = one_update(tiny_model, {"gradient_checkpointing": True})
    assert checkpointing(ckpt) and not checkpointing(plain)
    assert ckpt_metrics["train/loss"] == pytest.approx(plain_metrics["train/loss"], rel=1e-5, abs=1e-7)
    assert ckpt_metrics["train/grad_norm"] == pytest.approx(plain_metrics["train/grad_norm"], rel=1e-4)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ckpt_delta, plain_delta, strict=True))


def test_bfloat16_weights_train(tiny_model: str):
    model, metrics, delta = one_update(tiny_model, {"dtype": "bfloat16"})
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert math.isfinite(metrics["train/loss"]) and any(d.abs().sum() > 0 for d in delta)


def test_trl_gets_the_same_schedule_and_checkpointing():
    from transformers import get_scheduler
    from trl import GRPOConfig

    from agentrl.config.agent import ToolCallingAgentConfig
    from agentrl.config.model import TinyModelConfig
    from agentrl.config.schema import RunConfig
    from agentrl.config.trainer import TRLTrainerConfig
    from agentrl.trainers.trl.args import grpo_config_kwargs

    settings = RunConfig(seed=0, trainer=TRLTrainerConfig(lr=0.01, steps=6, lr_warmup_steps=2, lr_schedule="cosine"),
                         agent=ToolCallingAgentConfig(max_turns=2, max_response_tokens=16),
                         model=TinyModelConfig(dtype="bfloat16", gradient_checkpointing=True))
    args = GRPOConfig(**grpo_config_kwargs(settings, output_dir="/tmp/agentrl-lr-test", cpu=True))
    assert (args.lr_scheduler_type, args.warmup_steps, args.gradient_checkpointing) == ("cosine", 2, True)
    assert args.model_init_kwargs == {"dtype": "bfloat16"}
    # transformers' scheduler of that name, as TRL's Trainer builds it, moves the rate every step.
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    sched = get_scheduler(args.lr_scheduler_type, opt, num_warmup_steps=args.get_warmup_steps(6),
                          num_training_steps=6)
    rates = []
    for _ in range(6):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[:3] == pytest.approx([0.0, 0.005, 0.01]) and rates[3] > rates[4] > rates[5] > 0
    settings.trainer.lr_schedule = "constant"
    const = grpo_config_kwargs(settings, output_dir="/x", cpu=True)
    assert const["lr_scheduler_type"] == "constant_with_warmup"
