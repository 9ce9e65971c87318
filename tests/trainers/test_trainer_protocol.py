"""The `Trainer` protocol every backend satisfies, and the built-in GRPO step through its public API only.

The GRPO tests run the real trainer on arith with a small tiny model (real engine, session server, env server):
`setup(plan)`, `train_step(step)`, `cleanup()`. A random tiny model never earns arith's reward, so they keep
groups without signal (`drop_no_signal=false`, failures penalized): every step then trains and pushes, and the
engine's weight version after step n is n, which is what the play-ahead checks read.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from agentrl.models.tiny import ensure_tiny_model
from agentrl.plan import PlanError, build_plan
from agentrl.testing.config import compose_config
from agentrl.trainers.common.protocol import MEMBERS, TrainerBase, missing_members
from agentrl.trainers.common.resume import AGENTRL, TRANSFORMERS
from agentrl.trainers.common.step_products import StepStats
from agentrl.trainers.grpo.trainer import GRPOTrainer
from agentrl.trainers.miles.trainer import MilesTrainer
from agentrl.trainers.sft.trainer import SFTTrainer
from agentrl.trainers.trl.trainer import TRLTrainer

SMALL = dict(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
             max_position_embeddings=512)
BACKENDS = [GRPOTrainer, SFTTrainer, TRLTrainer, MilesTrainer]
AGENTRL_DIR = Path(__file__).resolve().parents[2] / "agentrl"


class _Tracker:
    run_id = "test-run"

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: Any, folder: str) -> None:
        pass

    def log_table(self, rows: list[dict[str, Any]], name: str) -> None:
        pass

    def log_model(self, model_dir: Any, name: str = "model") -> None:
        pass


compose_cfg = compose_config


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
def test_every_backend_declares_the_whole_protocol(backend: type) -> None:
    assert issubclass(backend, TrainerBase)
    assert missing_members(backend) == []
    assert backend.checkpoint_kind in (None, AGENTRL, TRANSFORMERS)
    assert isinstance(backend.resumes_itself, bool) and isinstance(backend.checks_model_itself, bool)
    assert all(callable(getattr(backend, m)) for m in MEMBERS if m not in ("checkpoint_kind", "resumes_itself",
                                                                         "checks_model_itself"))


@pytest.mark.parametrize("backend", [SFTTrainer, TRLTrainer, MilesTrainer], ids=lambda c: c.__name__)
def test_a_backend_whose_loop_is_elsewhere_refuses_train_step_naming_itself(backend: type) -> None:
    with pytest.raises(NotImplementedError, match=f"{backend.__name__} runs its steps inside its own loop"):
        backend.train_step(object.__new__(backend), 1)


def test_the_plan_refuses_a_trainer_target_that_is_no_trainer(tmp_path: Path) -> None:
    cfg = compose_cfg("env=arith", "trainer._target_=agentrl.rewards.EnvScore", "trainer.warm_start.enabled=false")
    with pytest.raises(PlanError, match=r"trainer._target_=agentrl.rewards.EnvScore is not a trainer: it lacks "
                                        r"checkpoint_kind, resumes_itself, .*closing_lines"):
        build_plan(cfg, choices={"env": "arith"}, run_dir=tmp_path)


@pytest.mark.parametrize("module", ["run.py", "plan.py"])
def test_run_and_plan_call_the_trainer_without_probes(module: str) -> None:
    """No getattr/hasattr on a trainer or its class: the protocol declares what they read."""
    tree = ast.parse((AGENTRL_DIR / module).read_text())
    probes = [ast.unparse(node) for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and node.args and "trainer" in ast.unparse(node.args[0])]
    assert probes == []


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return ensure_tiny_model(str(tmp_path_factory.mktemp("models") / "small"), seed=0, **SMALL)


def grpo(model: str, tmp_path: Path, *extra: str) -> GRPOTrainer:
    """The built-in trainer on arith, two rows of two samples a step, every group kept."""
    small = [f"model.{k}={v}" for k, v in SMALL.items()]
    cfg = compose_cfg("env=arith", "agent=tool_calling", "reward=env_score", f"model.path={model}", *small,
                      "agent.max_turns=2", "agent.max_response_tokens=8", "trainer.samples_per_prompt=2",
                      "trainer.prompts_per_step=2", "trainer.max_extra_rows=0", "trainer.warm_start.enabled=false",
                      "trainer.drop_no_signal=false", "trainer.model_failures=penalize", "trainer.eval_limit=2",
                      "trainer.lr=1e-2", f"trainer.checkpoint_path={tmp_path / 'ckpt'}",
                      f"paths.output_root={tmp_path / 'out'}", *extra)
    plan = build_plan(cfg, choices={"env": "arith", "agent": "tool_calling"}, run_dir=tmp_path / "run")
    return GRPOTrainer(plan=plan, tracker=_Tracker())


def sampled_versions(stats: StepStats) -> list[int]:
    return [v for r in stats.batch.played if r.sample is not None
            for v in r.sample.metadata.get("weight_versions", ()) if v is not None]


@pytest.mark.parametrize("overlap", [1, 0], ids=["max_staleness=1", "max_staleness=0"])
def test_step_n_plus_1_is_played_ahead_on_the_weights_step_n_trains_from(small_model: str, tmp_path: Path,
                                                                        overlap: int) -> None:
    t = grpo(small_model, tmp_path, "trainer.steps=3", f"trainer.max_staleness={overlap}")
    assert t.setup(t.plan) == 1
    try:
        with pytest.raises(RuntimeError, match=r"train_step\(2\): steps run in order .* the next is 1"):
            t.train_step(2)
        stats = [t.train_step(step) for step in (1, 2, 3)]
    finally:
        t.cleanup()
    assert [s.updates for s in stats] == [1.0, 1.0, 1.0]  # every step pushed: version n once step n trained
    assert [s.batch.step for s in stats] == [1, 2, 3]
    # Played ahead, step n+1's play starts before step n's push: on version n-1. Otherwise on version n.
    assert [s.batch.played_from for s in stats] == ([0, 0, 1] if overlap else [0, 1, 2])
    for s in stats:  # every sampled turn lies between the play's start and the last push before it trained
        versions = sampled_versions(s)
        assert versions and all(s.batch.played_from <= v <= s.step - 1 for v in versions), (s.step, versions)
    # Nothing was played past the last step; the rows drawn are exactly the three steps'.
    assert t.rows.cursor == stats[-1].batch.row_cursor == 6
    metrics = stats[-1].as_metrics()
    for key in ("train/reward", "train/loss", "train/updates", "rollout/groups_kept", "rollout/rows_drawn",
                "rollout/weight_lag", "time/generate_s", "time/generate_wait_s", "time/train_s",
                "time/weight_push_s", "time/step_s", "perf/generate_tokens_per_s", "perf/train_tokens_per_s"):
        assert key in metrics, key
    assert metrics["rollout/groups_kept"] == 2 and metrics["rollout/rows_drawn"] == 2
    assert metrics["train/reward"] == stats[-1].reward


def test_a_checkpoint_saves_the_cursor_of_the_steps_trained_not_the_step_played_ahead(small_model: str,
                                                                                      tmp_path: Path) -> None:
    """With step 2 already drawn and playing, a checkpoint of step 1 resumes at step 1's cursor: the resumed run
    draws step 2's rows again, in the same order."""
    t = grpo(small_model, tmp_path, "trainer.steps=2", "trainer.max_staleness=1")
    t.setup(t.plan)
    try:
        first = t.train_step(1)
        t.save(1)
        second = t.train_step(2)
    finally:
        t.cleanup()
    assert first.batch.row_cursor == 2 and second.batch.row_cursor == 4
    again = grpo(small_model, tmp_path, "trainer.steps=2", "trainer.max_staleness=1", "trainer.resume=true")
    assert again.setup(again.plan) == 2
    try:
        assert again.rows.cursor == 2
        replayed = again.train_step(2)
    finally:
        again.cleanup()
    assert sorted(r.row["metadata"]["index"] for r in replayed.batch.played) == \
        sorted(r.row["metadata"]["index"] for r in second.batch.played)
