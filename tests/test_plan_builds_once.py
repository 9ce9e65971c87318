"""Config becomes objects in one place, the plan (issue 28): no module below it instantiates a config group, and
the modules converted to the plan's typed settings read no `cfg` (AST scans); the plan carries the model source,
the engine factory and, for a run, the tracker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agentrl.plan import EngineFactory, ModelSource, PlanError, build_plan
from agentrl.testing.config import compose_config

ROOT = Path(__file__).resolve().parents[1] / "agentrl"
# Entry points that serve one group with no training plan of their own (python -m agentrl.envs.serve, ...).
STANDALONE_SERVERS = {"envs/serve.py", "inference/serve.py"}
# Hooks Miles calls inside its Ray workers, which hold no plan: they rebuild the one group they need from the config
# the launch carried (reward=rubric's rm hook, from $AGENTRL_REWARD).
RAY_WORKER_HOOKS = {"trainers/miles/rubric.py"}
# Where the composed config is still a DictConfig: the Hydra jobs that build the plan (run, eval, the CLI), the
# config package itself, the plan, a TRL rank rebuilding its checked plan from the portable spec, and the tracker,
# which records the composed config as the run's params. Every other module takes everything from the plan (its
# objects and `plan.settings`) and reads no `cfg` at all.
ABOVE_THE_PLAN = {"plan.py", "run.py", "eval_run.py", "__main__.py", "trl_rank.py", "tracking/mlflow_tracker.py"}
CFG_FREE = sorted(rel for path in ROOT.rglob("*.py")
                  if not (rel := path.relative_to(ROOT).as_posix()).startswith("config/")
                  and rel not in ABOVE_THE_PLAN | STANDALONE_SERVERS | RAY_WORKER_HOOKS)


def _calls_instantiate(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "instantiate":
                lines.append(node.lineno)
    return lines


def test_only_the_plan_turns_config_groups_into_objects() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "plan.py" or rel in STANDALONE_SERVERS | RAY_WORKER_HOOKS:
            continue
        found += [f"agentrl/{rel}:{line}" for line in _calls_instantiate(ast.parse(path.read_text()))]
    assert found == [], f"instantiate() below the plan (use the plan's objects): {found}"


@pytest.mark.parametrize("rel", CFG_FREE)
def test_converted_modules_read_no_cfg(rel: str) -> None:
    tree = ast.parse((ROOT / rel).read_text())
    reads = [f"agentrl/{rel}:{n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute | ast.Subscript) and isinstance(n.ctx, ast.Load)
             and ((isinstance(n.value, ast.Name) and n.value.id in ("cfg", "server_cfg"))
                  or (isinstance(n, ast.Attribute) and n.attr == "cfg"))]
    assert reads == [], f"read plan.settings instead: {reads}"


def _cfg(tmp_path: Path, *overrides: str):
    return compose_config(*overrides, f"paths.output_root={tmp_path / 'out'}")


def test_the_plan_carries_the_model_source_engine_factory_and_tracker(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "+recipe=gridsim_grpo", f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}")
    checked = build_plan(cfg, choices={}, run_dir=tmp_path / "run")
    assert isinstance(checked.model, ModelSource) and isinstance(checked.engine_factory, EngineFactory)
    assert checked.tracker is None  # a plan built to check opens no tracking store
    plan = build_plan(cfg, choices={}, run_dir=tmp_path / "run", tracked=True)
    assert plan.tracker.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}" and plan.tracker.run_id is None
    assert plan.model.path() == plan.settings.model.path  # the tiny model, made where model.path says


def test_a_logger_setting_its_tracker_refuses_fails_as_a_plan_error(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "+recipe=gridsim_grpo", "logger.heartbeat_s=0")
    with pytest.raises(PlanError, match=r"logger: .*logger.heartbeat_s must be > 0"):
        build_plan(cfg, choices={}, run_dir=tmp_path / "run", tracked=True)


def test_the_agent_settings_declare_their_roles(tmp_path: Path) -> None:
    """What services and policies read (`agent.role_list()`): a multi-role pattern's roles, typed; none for the
    single agent, whose schema has no `roles` key."""
    plan = build_plan(_cfg(tmp_path, "env=arith", "agent=thinker_verifier", "agent.roles.1.frozen=true"), choices={},
                      run_dir=tmp_path / "run")
    assert [(r.name, r.frozen) for r in plan.settings.agent.role_list()] == [("thinker", False), ("verifier", True)]
    single = build_plan(_cfg(tmp_path, "env=arith"), choices={}, run_dir=tmp_path / "run")
    assert single.settings.agent.role_list() == []
