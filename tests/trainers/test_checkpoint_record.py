"""A checkpoint's record (`resume.checkpoint_record`) is the plan's typed settings serialised by the one function
that does it (`config.schema.settings_dict`): equal to the composed config it was built from, so a checkpoint
recorded before the plan was typed still resumes without differences, and a changed identity key is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from agentrl.plan import build_plan
from agentrl.testing.config import compose_config
from agentrl.trainers.common.resume import checkpoint_record, differences


def _composed(tmp_path: Path, *overrides: str) -> Any:
    return compose_config(*overrides, f"paths.output_root={tmp_path / 'out'}")


def _json(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=str))  # as `write_record` writes it and `read_record` reads it


@pytest.mark.parametrize("overrides", [["+recipe=gridsim_grpo"], ["+recipe=arith_co_evolution"], ["+recipe=reasoning_gym_grpo"],
                                       ["env=arith", "trainer=trl"], ["env=arith", "agent=thinker_verifier"]])
def test_a_record_of_the_composed_config_resumes_against_the_typed_settings(tmp_path: Path, overrides) -> None:
    cfg = _composed(tmp_path, *overrides)
    choices = {"trainer": "grpo", "env": "arith", "agent": "x", "model": "tiny", "reward": "env_score"}
    plan = build_plan(cfg, choices=choices, run_dir=tmp_path / "run")
    record = checkpoint_record(plan, "run-1")
    assert record["run_id"] == "run-1" and record["choices"]["agent"] == "x"
    composed = OmegaConf.to_container(cfg, resolve=True)  # what a record held before the plan was typed
    assert record["config"] == composed
    before = {"run_id": "run-1", "choices": record["choices"], "config": composed}
    assert differences(_json(before), plan.settings, choices) == []
    assert differences(_json(record), plan.settings, choices) == []


def test_a_changed_identity_key_is_named_and_a_runtime_key_is_not(tmp_path: Path) -> None:
    plan = build_plan(_composed(tmp_path, "+recipe=gridsim_grpo"), choices={}, run_dir=tmp_path / "run")
    record = _json(checkpoint_record(plan, "run-1"))
    other = build_plan(_composed(tmp_path, "+recipe=gridsim_grpo", "agent.max_turns=3", "env.server.port=23001",
                                 "trainer.lr=1e-3"), choices={}, run_dir=tmp_path / "run")
    assert differences(record, other.settings, {}) == ["agent.max_turns: 4 -> 3"]
