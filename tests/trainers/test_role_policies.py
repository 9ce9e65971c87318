"""Roles that name their own model: one optimizer per model, each updated only by its own samples; frozen
roles and external endpoints are played but never updated; checkpoints save and restore every policy.

The trainer runs in-process on thinker_verifier/arith (both roles always play a turn, so both models get
samples). A random tiny model never earns an arith reward, so after real plays the tests give each group
alternating rewards: the rollouts, routing, partition, optimizers and weight pushes are all the real ones.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.agents.record import Rollout
from agentrl.inference.sessions.samples import Sample
from agentrl.models.tiny import ensure_tiny_model
from agentrl.plan import build_plan
from agentrl.play.policies import MAIN, plan_policies, routing, untrained_roles
from agentrl.play.rollout import RoutedSessionPool, make_row
from agentrl.testing.config import compose_config
from agentrl.trainers.grpo import checkpoint as ckpt
from agentrl.trainers.grpo.learner import items_from
from agentrl.trainers.grpo.policy_steps import make_learner, step_policies
from agentrl.trainers.grpo.trainer import GRPOTrainer

SMALL = dict(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
             max_position_embeddings=512)


class _Tracker:
    run_id = "test-run"

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, dict(metrics)))

    def log_artifact(self, path: Any, folder: str) -> None:
        pass

    def log_table(self, rows: list[dict[str, Any]], name: str) -> None:
        pass

    def log_model(self, model_dir: Any, name: str = "model") -> None:
        pass


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("models")
    return (ensure_tiny_model(str(root / "main"), seed=0, **SMALL),
            ensure_tiny_model(str(root / "verifier"), seed=1, **SMALL))


def trainer(models: tuple[str, str], tmp_path: Path, *extra: str) -> GRPOTrainer:
    """A GRPO trainer on thinker_verifier/arith whose verifier plays its own tiny model."""
    small = [f"model.{k}={v}" for k, v in SMALL.items()]
    overrides = ["env=arith", "agent=thinker_verifier", "reward=env_score", f"model.path={models[0]}", *small,
                 f"agent.roles.1.model={models[1]}", "agent.max_turns=2", "agent.max_response_tokens=8",
                 "trainer.samples_per_prompt=2", "trainer.prompts_per_step=2", "trainer.warm_start.enabled=false",
                 "trainer.lr=1e-2", "trainer.max_extra_rows=0", "trainer.eval_limit=2",
                 f"trainer.checkpoint_path={tmp_path / 'ckpt'}", f"paths.output_root={tmp_path / 'out'}", *extra]
    cfg = compose_config(*overrides)
    plan = build_plan(cfg, choices={"env": "arith", "agent": "thinker_verifier"}, run_dir=tmp_path / "run")
    return GRPOTrainer(plan=plan, tracker=_Tracker())


def play_with_signal(t: GRPOTrainer) -> list[Rollout]:
    """Real plays of two train rows, then alternating rewards within each (row, role) group."""
    svc = t.services
    rows = [make_row(t.plan.bundle, "train", i, svc.env_url, svc.env_settings) for i in (0, 1)]
    groups = asyncio.run(svc.runner.play_rows(rows, 2, request_kwargs={"temperature": 1.0}, seed_parts=(0,)))
    played = [p for g in groups for p in g]
    seen: dict[tuple, int] = {}
    for p in played:
        seen[p.group] = seen.get(p.group, 0) + 1
        p.reward = float(seen[p.group] % 2)
    return played


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _played(role: str, policy: str, reward: float, row: int, *, frozen: bool = False) -> Rollout:
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], reward)
    return Rollout(role=role, reward=reward, group=("train", row, role), frozen=frozen, policy=policy, sample=sample)


def test_policies_routes_and_partition(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    roles = [{"name": "thinker"}, {"name": "verifier", "model": str(folder)},
             {"name": "judge", "model": str(folder) + "/", "frozen": True},
             {"name": "critic", "model": "http://127.0.0.1:9/v1", "frozen": False}]
    policies = plan_policies(roles)
    assert [(p.name, p.roles, p.trainable, p.external) for p in policies] == [
        ("verifier", ["verifier", "judge"], True, False), ("critic", ["critic"], False, True)]
    assert policies[1].source == "http://127.0.0.1:9"  # the agent appends /v1/chat/completions itself
    maps = routing(policies, {"verifier": "http://127.0.0.1:5"})
    assert maps == {"routes": {"verifier": "http://127.0.0.1:5", "judge": "http://127.0.0.1:5"},
                    "external": {"critic": "http://127.0.0.1:9"},
                    "role_policy": {"verifier": "verifier", "judge": "verifier", "critic": "critic"}}
    assert untrained_roles(policies) == ["critic"]
    assert plan_policies([{"name": "a", "model": str(folder), "frozen": True}])[0].trainable is False
    with pytest.raises(FileNotFoundError, match="role 'x'.*neither a model folder"):
        plan_policies([{"name": "x", "model": str(tmp_path / "missing")}])

    # The external role gets the endpoint itself; the others a session on their own server.
    pool = RoutedSessionPool("http://main", {"verifier": "http://v"}, external=maps["external"])
    assert asyncio.run(pool.open("critic")) == "http://127.0.0.1:9" and pool.server("verifier") == "http://v"

    # Advantages over the whole (row, role) groups; each policy keeps only its own, non-frozen samples.
    played = [_played("thinker", MAIN, r, 0) for r in (0.0, 1.0)] + \
             [_played("verifier", "verifier", r, 0) for r in (1.0, 0.0)] + \
             [_played("judge", "verifier", r, 0, frozen=True) for r in (1.0, 0.0)]
    _, adv = items_from(played)
    main_items, _ = items_from(played, policy=MAIN)
    verifier_items, _ = items_from(played, policy="verifier")
    assert [i.advantage for i in main_items] == adv[:2].tolist() and main_items[0].advantage < 0
    assert [i.advantage for i in verifier_items] == adv[2:4].tolist() and verifier_items[0].advantage > 0
    assert items_from(played, policy="critic")[0] == []


def test_each_model_learns_only_from_its_samples_and_resume_restores_both(models, tmp_path: Path) -> None:
    t = trainer(models, tmp_path)
    t.setup(t.plan)
    try:
        (_, verifier) = t.policies
        assert verifier.learner is not None
        played = play_with_signal(t)
        assert {(p.role, p.policy) for p in played} == {("thinker", MAIN), ("verifier", "verifier")}
        assert t.services.policy_engines["verifier"].stats.requests == sum(p.role == "verifier" for p in played)
        # The expected updates: a fresh learner per model, stepping on that model's samples only.
        expected = {}
        for name, learner in ((MAIN, t.learner), ("verifier", verifier.learner)):
            twin = make_learner(t.t, copy.deepcopy(learner.model), t.tokenizer)
            twin.optimizer.load_state_dict(learner.optimizer.state_dict())
            twin.step(items_from(played, policy=name)[0])
            expected[name] = (weights(learner.model), weights(twin.model))
        metrics, _ = step_policies(t.policies, played, t.services.policy_engines)
        for name, learner in ((MAIN, t.learner), ("verifier", verifier.learner)):
            before, want = expected[name]
            assert not same(before, weights(learner.model)), f"{name} did not change"
            assert same(want, weights(learner.model)), f"{name} was updated by samples it did not play"
        assert metrics["train/tokens"] == sum(sum(p.sample.loss_mask) for p in played if p.policy == MAIN)
        assert metrics["train/verifier/tokens"] == sum(sum(p.sample.loss_mask) for p in played if p.role == "verifier")
        assert t.services.policy_engines["verifier"].weight_version == 1 and t.services.engine.weight_version == 1
        t.save(1)
    finally:
        t.cleanup()
    saved = ckpt.latest(tmp_path / "ckpt")
    assert (ckpt.policy_path(saved, "verifier") / "config.json").is_file()

    again = trainer(models, tmp_path, "trainer.resume=true")
    assert again.setup(again.plan) == 2
    try:
        for old, new in ((t.learner, again.learner), (verifier.learner, again.policies[1].learner)):
            assert same(weights(old.model), weights(new.model))
            a, b = old.optimizer.state_dict(), new.optimizer.state_dict()
            assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys() != set()
            for k in a["state"]:
                assert all(torch.equal(a["state"][k][n], b["state"][k][n]) for n in a["state"][k])
    finally:
        again.cleanup()


def test_a_frozen_role_model_is_played_but_never_updated(models, tmp_path: Path) -> None:
    t = trainer(models, tmp_path, "agent.roles.1.frozen=true")
    t.setup(t.plan)
    try:
        (_, verifier) = t.policies
        assert verifier.learner is None and not verifier.trainable
        engine = t.services.policy_engines["verifier"]
        start = weights(engine.model)
        main_before = weights(t.learner.model)
        played = play_with_signal(t)
        assert any(p.role == "verifier" and p.frozen and sum(p.sample.loss_mask) for p in played)
        metrics, _ = step_policies(t.policies, played, t.services.policy_engines)
        assert engine.stats.requests > 0 and engine.weight_version == 0
        assert same(start, weights(engine.model))
        assert not same(main_before, weights(t.learner.model))
        assert not any(k.startswith("train/verifier/") for k in metrics)
        t.save(1)
    finally:
        t.cleanup()
    assert not ckpt.policy_path(ckpt.latest(tmp_path / "ckpt"), "verifier").exists()


def test_two_steps_end_to_end_with_a_role_model(models, tmp_path: Path) -> None:
    t = trainer(models, tmp_path, "trainer.steps=2", "trainer.checkpoint_every=1", "trainer.eval_every=0")
    final = t.fit()
    assert "eval/reward" in final
    logged = dict(t.tracker.logged[1:3])
    assert sorted(logged) == [1, 2]
    for key in ("train/loss", "train/verifier/loss", "train/verifier/grad_norm", "reward/verifier"):
        assert key in logged[2], sorted(logged[2])
    saved = ckpt.latest(tmp_path / "ckpt")
    assert saved.name == "step-000002" and "verifier" in ckpt.load_state(saved)["policy_optimizers"]
