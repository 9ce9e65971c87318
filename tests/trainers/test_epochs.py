"""Several optimizer steps per batch (`trainer.epochs`, `trainer.mini_batches`): the ratio leaves 1 after the first
update, the clip binds, truncated IS keeps the batch's first policy as its old one, and a two-step CLI run of each
per-role advantage with epochs=2 logs finite metrics (docs/training.md, "Several optimizer steps per batch")."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.trainers.grpo.grpo_math import policy_loss
from agentrl.trainers.grpo.learner import Algorithm, Learner, TrainItem
from tests.trainers.test_grpo_cli import TINY, _cli, _runs


def test_the_ratio_is_taken_against_the_given_behaviour_logprobs_hand_computed() -> None:
    # p = -1, p_old = -1.5, q = -1.2, A = 1, clip 0.2, cap 2: ratio e^0.5 > 1.2 is clipped (the min picks 1.2);
    # the TIS weight is min(e^(p_old - q), 2) = e^-0.3. Without p_old the ratio would be 1 and nothing clipped.
    p = torch.tensor([[-1.0]], requires_grad=True)
    out = policy_loss(p, torch.tensor([[-1.2]]), torch.tensor([1.0]), torch.ones(1, 1), tis_cap=2.0,
                      behaviour_logprobs=torch.tensor([[-1.5]]))
    assert out.loss.item() == pytest.approx(-1.2 * math.exp(-0.3), abs=1e-6)
    assert (out.clip_fraction, out.approx_kl) == (1.0, pytest.approx(0.5 * 0.5 ** 2))
    assert out.tis_weight == pytest.approx(math.exp(-0.3), abs=1e-6)
    out.loss.backward()
    assert p.grad.item() == 0.0  # the clipped branch carries no gradient
    same = policy_loss(p.detach(), torch.tensor([[-1.2]]), torch.tensor([1.0]), torch.ones(1, 1), tis_cap=2.0)
    assert (same.clip_fraction, same.approx_kl) == (0.0, 0.0)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from agentrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(str(tmp_path_factory.mktemp("m") / "tiny"), seed=5, vocab_size=512, hidden_size=32,
                             num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                             max_position_embeddings=64)


def _learner(path: str, *, lr: float = 1e-2, tis_cap: float = 2.0, **kw: int) -> Learner:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    return Learner(model, lr=lr, temperature=1.0, micro_batch_samples=3, grad_clip=1e9,
                   algorithm=Algorithm.of(tis_cap=tis_cap), **kw)


def _items(learner: Learner) -> list[TrainItem]:
    """Six samples of varying length, two groups' worth of advantages, with the model's own rollout logprobs."""
    items = []
    for i in range(6):
        ids = [7, 8, 9] + [20 + i, 30 + 2 * i, 40][: 1 + i % 3]
        items.append(TrainItem(ids, [0, 0, 0] + [1] * (len(ids) - 3), [0.0] * len(ids), (-1.0) ** i * (1 + i / 5)))
    for it, lp in zip(items, learner._logprobs(items), strict=True):  # on-policy: q = the learner's own logprob
        it.rollout_logprobs = [0.0, *lp.tolist()]
    return items


def _adam_steps(learner: Learner) -> int:
    return int(next(iter(learner.optimizer.state.values()))["step"])


def test_one_epoch_is_one_update_with_the_ratio_at_1(tiny_model: str) -> None:
    learner = _learner(tiny_model)
    m = learner.step(_items(learner))
    assert _adam_steps(learner) == 1
    assert m["train/approx_kl"] == 0.0 and m["train/clip_fraction"] == 0.0  # today's one update per batch


def test_the_second_epoch_moves_the_ratio_away_from_1(tiny_model: str) -> None:
    learner = _learner(tiny_model, epochs=2)
    m = learner.step(_items(learner))
    assert _adam_steps(learner) == 2
    # The first pass's ratio is exactly 1 (TIS: against the batch's own start), so the mean is the second's / 2.
    assert m["train/approx_kl"] > 1e-8 and math.isfinite(m["train/loss"])
    assert m["train/tokens"] == sum(sum(it.loss_mask) for it in _items(learner))


def test_mini_batches_after_the_first_are_ratioed_against_the_batchs_start(tiny_model: str) -> None:
    """Two mini-batches, one epoch: the second updates after the first, so its ratio to the old policy is off 1.

    Were p_old taken at each mini-batch's own forward pass, every ratio would stay at 1 (approx_kl 0)."""
    learner = _learner(tiny_model, mini_batches=2, epochs=2)
    m = learner.step(_items(learner))
    assert _adam_steps(learner) == 4
    assert m["train/approx_kl"] > 1e-8


def test_the_clip_binds_on_a_large_step(tiny_model: str) -> None:
    learner = _learner(tiny_model, lr=0.3, epochs=3)
    m = learner.step(_items(learner))
    assert m["train/clip_fraction"] > 0.0 and m["train/approx_kl"] > 1e-3
    # Without TIS the ratio is against the rollout logprobs: the same shape of result.
    plain = _learner(tiny_model, lr=0.3, epochs=3, tis_cap=0.0)
    assert plain.step(_items(plain))["train/clip_fraction"] > 0.0


@pytest.mark.parametrize("key", ["epochs", "mini_batches"])
def test_the_schema_refuses_fewer_than_one_naming_the_key(key: str) -> None:
    with pytest.raises(ValueError, match=f"trainer.{key} must be >= 1"):
        GRPOTrainerConfig(**{key: 0})
    with pytest.raises(ValueError, match="epochs and mini_batches must be >= 1"):
        Learner(torch.nn.Linear(2, 2), lr=1e-3, **{key: 0})


@pytest.mark.slow
def test_two_cli_steps_of_each_role_advantage_with_two_epochs_log_finite_metrics(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = _cli(["-m", "+recipe=gridsim_grpo", *TINY, "trainer.steps=2", "trainer.eval_every=0",
                 "trainer.checkpoint_every=0", "trainer.epochs=2", "trainer.mini_batches=2",
                 "trainer.episode_roles=[]", "trainer.advantage=per_role,rae,hierarchical"], home)
    assert proc.returncode == 0, proc.stderr[-4000:]
    client, runs = _runs(home)
    children = {r.data.params["trainer/advantage"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert sorted(children) == ["hierarchical", "per_role", "rae"]
    for kind, run in children.items():
        for key in ("train/loss", "train/clip_fraction", "train/approx_kl", "train/grad_norm", "eval/reward"):
            history = client.get_metric_history(run.info.run_id, key)
            assert history, f"{kind}: {key} was not logged"
            assert all(math.isfinite(m.value) for m in history), f"{kind}: {key} = {[m.value for m in history]}"
