"""Roles with a model of their own (`agent.roles.<i>.model`) play it in every play of a run, not only in GRPO's:
the SFT trainer's evals and a warm start's eval start their services from the plan's policies, and a missing
role model is refused when the plan is built, before anything trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.plan import PlanError, build_plan
from agentrl.testing.config import compose_config
from agentrl.testing.tiny_models import shared_tiny_model

SMALL = dict(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
             max_position_embeddings=512)


def _plan(tmp_path: Path, *overrides: str):
    small = [f"model.{k}={v}" for k, v in SMALL.items()]
    cfg = compose_config("env=arith", "agent=thinker_verifier", "reward=env_score", *small, "agent.max_turns=2",
                         "agent.max_response_tokens=4", "trainer.eval_limit=2", f"paths.output_root={tmp_path}", *overrides)
    return build_plan(cfg, choices={"env": "arith"}, run_dir=tmp_path / "run")


def test_services_started_without_policies_route_a_role_to_its_own_model(tmp_path: Path) -> None:
    from agentrl.play.services import start_services

    main = shared_tiny_model(seed=0, **SMALL)
    verifier = shared_tiny_model(seed=1, **SMALL)
    plan = _plan(tmp_path, f"model.path={main}", f"agent.roles.1.model={verifier}", "trainer.warm_start.enabled=false")
    services = start_services(plan, main)  # as the SFT evals and the warm start's eval call it
    try:
        assert set(services.policy_engines) == {"main", "verifier"}
        assert services.policy_engines["verifier"] is not services.engine
        own = services.runner.routes["verifier"]
        assert own != services.session_server.base_url and "thinker" not in services.runner.routes
        assert services.runner.role_policy["verifier"] == "verifier"
    finally:
        services.close()
    # An explicit empty list still means "the shared model plays every role" (a caller that chose so).
    services = start_services(plan, main, [])
    try:
        assert set(services.policy_engines) == {"main"} and not services.runner.routes
    finally:
        services.close()


@pytest.mark.parametrize("trainer", ["sft", "grpo"])
def test_a_missing_role_model_is_refused_at_plan_time(tmp_path: Path, trainer: str) -> None:
    main = shared_tiny_model(seed=0, **SMALL)
    with pytest.raises(PlanError, match="role 'verifier': model '.*missing' is neither a model folder"):
        _plan(tmp_path, f"trainer={trainer}", f"model.path={main}", f"agent.roles.1.model={tmp_path / 'missing'}")
