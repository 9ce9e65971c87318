"""The GRPO family as config: schema invariants, plan-time refusals (Miles included), each loss on a real model
with multi-role groups, and a two-step CLI run of each loss (docs/training.md "Algorithms")."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentrl.agents.record import Rollout
from agentrl.config.algorithm import LOSSES
from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.plan import PlanError, build_plan, typed_settings
from agentrl.testing.config import compose_config
from agentrl.trainers.grpo.learner import STEP_METRICS, Algorithm, Learner
from agentrl.trainers.miles.args import MilesConfigError, check_config
from tests.trainers.test_grpo_cli import TINY, _cli, _runs


@pytest.mark.parametrize(("fields", "message"), [
    ({"loss": "ppo"}, "trainer.loss='ppo': choose one of grpo, dr_grpo, dapo, gspo"),
    ({"advantage": "zscore"}, "trainer.advantage='zscore'"),
    ({"loss": "dr_grpo", "advantage": "group_norm"}, "trainer.advantage=group_norm contradicts trainer.loss=dr_grpo"),
    ({"kl_estimator": "k2"}, "trainer.kl_estimator='k2'"),
    ({"kl_coef": -0.1}, "trainer.kl_coef must be >= 0"),
    ({"entropy_coef": -0.1}, "trainer.entropy_coef must be >= 0"),
    ({"tis_cap": 0.5}, "trainer.tis_cap=0.5: the truncation cap must be >= 1"),
    ({"clip_low": 1.0}, "trainer.clip_low must be in"),
    ({"norm_tokens": 0}, "trainer.norm_tokens must be >= 1"),
    ({"overlong_buffer": 8}, "trainer.overlong_buffer applies only to trainer.loss=dapo"),
    ({"loss": "dapo", "overlong_max_tokens": 10, "overlong_buffer": 11}, "trainer.overlong_buffer must be in"),
])
def test_schema_refuses_each_invariant_naming_the_key(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        GRPOTrainerConfig(**fields)


def test_a_bad_choice_fails_when_the_plan_is_built(tmp_path: Path) -> None:
    cfg = compose_config("+recipe=gridsim_grpo", "trainer.loss=dr_grpo", "trainer.advantage=group_norm")
    with pytest.raises(PlanError, match="trainer.advantage=group_norm contradicts trainer.loss=dr_grpo"):
        build_plan(cfg, choices={}, run_dir=tmp_path)


@pytest.mark.parametrize(("override", "flag"), [
    ("trainer.loss=gspo", "--advantage-estimator,gspo"),
    ("trainer.loss=dr_grpo", "--disable-grpo-std-normalization"),
    ("trainer.loss=dapo", "--calculate-per-token-loss"),
    ("trainer.advantage=group_mean", "--disable-grpo-std-normalization"),
    ("trainer.advantage=rloo", "reinforce_plus_plus_baseline"),
    ("trainer.kl_estimator=k3", "--kl-loss-type"),
    ("trainer.entropy_coef=0.01", "--entropy-coef,0.01"),
    ("trainer.tis_cap=2.0", "--use-tis,--tis-clip,2.0"),
])
def test_miles_refuses_what_it_cannot_apply_naming_its_flag(tmp_path: Path, override: str, flag: str) -> None:
    cfg = compose_config("+recipe=gridsim_miles", override)
    with pytest.raises(PlanError, match=f"{override.split('=')[0]}=.*under trainer=miles.*{flag}"):
        build_plan(cfg, choices={}, run_dir=tmp_path)
    # The launcher's own check (dry run, construction) too, on typed settings that got past the schema's check.
    settings = typed_settings(compose_config("+recipe=gridsim_miles"))
    key = override.split("=")[0].removeprefix("trainer.")
    setattr(settings.trainer, key, cfg.trainer[key])
    with pytest.raises(MilesConfigError, match=flag):
        check_config(settings)


def test_the_defaults_keep_grpo_and_fill_each_losses_own() -> None:
    def algo(*overrides: str) -> Algorithm:
        return Algorithm.from_config(compose_config("+recipe=gridsim_grpo", *overrides).trainer)

    assert algo() == Algorithm.of() and algo().tis_cap == 2.0  # today's grpo, with truncated importance sampling
    assert algo("trainer.loss=dr_grpo").advantage == "group_mean"
    dapo = algo("trainer.loss=dapo")
    assert (dapo.clip_low, dapo.clip_high, dapo.overlong_max_tokens, dapo.overlong_buffer) == (0.2, 0.28, 96, 19)
    gspo = algo("trainer.loss=gspo", "trainer.advantage=rloo", "trainer.clip_high=0.001")
    assert (gspo.clip_low, gspo.clip_high, gspo.advantage) == (3e-4, 0.001, "rloo")
    assert algo("trainer.tis_cap=0").tis_cap == 0.0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from agentrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(str(tmp_path_factory.mktemp("m") / "tiny"), seed=3, vocab_size=512, hidden_size=32,
                             num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                             max_position_embeddings=64)


def test_a_learner_given_no_algorithm_updates_as_trainer_grpo_does() -> None:
    """The schema is the algorithm's one home: a `Learner` built without one (the micro-benchmarks') used to
    train without truncated importance sampling (tis_cap 0 restated in `Algorithm`, 2.0 in the schema)."""
    schema = GRPOTrainerConfig(overlong_max_tokens=None)
    learner = Learner(torch.nn.Linear(2, 2), lr=1e-3)
    assert learner.algorithm == Algorithm.from_config(schema) and learner.algorithm.tis_cap == schema.tis_cap == 2.0
    assert Algorithm.of(loss="dapo").clip_high == 0.28  # each loss's own defaults, as a run resolves them
    with pytest.raises(ValueError, match="trainer.tis_cap=0.5"):
        Algorithm.of(tis_cap=0.5)


@pytest.mark.parametrize("loss", LOSSES)
def test_each_loss_trains_on_role_groups_of_varying_size(tiny_model: str, loss: str) -> None:
    """Engine-sampled samples in groups of 5, 2 and 1 (a co-evolution row's solvers, rewriters, selector)."""
    from transformers import AutoModelForCausalLM

    from agentrl.inference.engines.embedded.engine import EmbeddedEngine

    torch.manual_seed(0)
    roles = [("solver", 5), ("rewriter", 2), ("selector", 1)]
    prompt = [5, 6, 7, 8]
    with EmbeddedEngine(tiny_model, max_batch_sequences=16) as engine:
        async def play() -> list:
            return await asyncio.gather(*(engine.generate(prompt, max_tokens=6, temperature=1.0, ignore_eos=True,
                                                          seed=i) for i in range(8)))
        done = asyncio.run(play())
    played = []
    for i, (role, c) in enumerate(zip([r for r, n in roles for _ in range(n)], done, strict=True)):
        sample = SimpleNamespace(token_ids=prompt + c.token_ids, loss_mask=[0] * 4 + [1] * len(c.token_ids),
                                 rollout_logprobs=[0.0] * 4 + c.logprobs)
        played.append(Rollout(role=role, reward=float(i % 3) / 2, group=("train", 0, role), sample=sample))
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    before = [p.detach().clone() for p in model.parameters()]
    algo = Algorithm.of(loss=loss, advantage="rloo" if loss == "dr_grpo" else "group_norm", clip_low=0.2,
                        clip_high=0.2, kl_coef=0.1, entropy_coef=0.01, tis_cap=2.0, norm_tokens=8,
                        overlong_max_tokens=6, overlong_buffer=2 if loss == "dapo" else None)
    learner = Learner(model, lr=1e-2, temperature=1.0, micro_batch_samples=3, algorithm=algo)
    items, adv = learner.items(played)
    assert adv[-1].item() == 0.0  # the lone selector has no baseline
    metrics = learner.step(items)
    assert set(metrics) == {f"train/{k}" for k in STEP_METRICS}
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["train/entropy"] > 0 and metrics["train/tokens"] == 48
    # On a CPU the engine and the learner compute the same float32 logprobs: importance weights are 1.
    assert metrics["train/logprob_gap_mean"] < 1e-4
    assert metrics["train/logprob_gap_mean"] <= metrics["train/logprob_gap_max"] < 1e-3
    assert metrics["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["train/tis_clipped_frac"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.slow
def test_two_steps_of_each_loss_through_the_cli_log_finite_metrics(tmp_path: Path) -> None:
    """One Hydra multirun over the losses (the issue's sweep), KL and entropy on: each child logs finite metrics."""
    home = tmp_path / "home"
    proc = _cli(["-m", "+recipe=gridsim_grpo", *TINY, "trainer.steps=2", "trainer.eval_every=0",
                 "trainer.checkpoint_every=0", "trainer.kl_coef=0.01", "trainer.entropy_coef=0.01",
                 f"trainer.loss={','.join(LOSSES)}"], home)
    assert proc.returncode == 0, proc.stderr[-4000:]
    client, runs = _runs(home)
    children = {r.data.params["trainer/loss"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert sorted(children) == sorted(LOSSES)
    for loss, run in children.items():
        for key in ("train/loss", "train/kl", "train/entropy", "train/tis_weight_mean", "train/tis_clipped_frac",
                    "train/logprob_gap_mean", "train/logprob_gap_max", "train/grad_norm", "eval/reward"):
            history = client.get_metric_history(run.info.run_id, key)
            assert history, f"{loss}: {key} was not logged"
            assert all(math.isfinite(m.value) for m in history), f"{loss}: {key} = {[m.value for m in history]}"
