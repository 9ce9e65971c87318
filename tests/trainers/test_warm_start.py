"""The warm start: a teacher the bundle lacks fails when the plan is built; a warm start made in a GRPO run is
logged to that run (loss, eval, wall time, the folder) and reused by the next; SFT's fit returns its end-of-run
keys and logs its model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentrl.plan import PlanError, build_plan
from agentrl.testing.config import compose_config

SMALL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
         "model.intermediate_size=64", "model.vocab_size=1024", "model.max_position_embeddings=1024",
         "agent.max_response_tokens=24", "trainer.eval_limit=2"]


class _Tracker:
    run_id = "test-run"
    trace_train_fraction = 0.0

    def __init__(self) -> None:
        self.logged: dict[str, list[tuple[int, float]]] = {}
        self.tags: dict[str, Any] = {}
        self.models: list[Path] = []
        self.traces: list[Any] = []

    def log_traces(self, traces: list[Any]) -> None:
        self.traces += traces

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.logged.setdefault(key, []).append((step, value))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.tags.update(tags)

    def log_artifact(self, path: Any, artifact_path: str | None = None) -> None:
        pass

    def log_table(self, rows: list[dict[str, Any]], name: str) -> None:
        pass

    def log_model(self, path: Any) -> None:
        self.models.append(Path(path))


def _plan(tmp_path: Path, *overrides: str) -> Any:
    cfg = compose_config(*overrides, f"paths.output_root={tmp_path / 'out'}")
    return build_plan(cfg, choices={}, run_dir=tmp_path / "run")


@pytest.mark.parametrize("overrides,message", [
    (["+recipe=gridsim_grpo", "trainer.warm_start.teacher=label"],
     "trainer.warm_start.teacher=label: bundle gridsim offers the teachers optimal, greedy"),
    (["env=arith", "trainer=sft", "trainer.teacher=greedy"],
     "trainer.teacher=greedy: bundle arith offers the teachers optimal, label"),
])
def test_a_teacher_the_bundle_lacks_fails_when_the_plan_is_built(tmp_path: Path, overrides, message) -> None:
    with pytest.raises(PlanError, match=message):
        _plan(tmp_path, *overrides)


def test_the_teacher_is_not_checked_when_no_warm_start_is_made(tmp_path: Path) -> None:
    # gridsim offers no `label` teacher, yet both plans build: one makes no warm start, the other reuses a folder.
    off = _plan(tmp_path, "+recipe=gridsim_grpo", "trainer.warm_start.teacher=label",
                "trainer.warm_start.enabled=false").settings.trainer.warm_start
    assert (off.enabled, off.teacher) == (False, "label")
    reused = _plan(tmp_path, "+recipe=gridsim_grpo", "trainer.warm_start.teacher=label",
                   f"trainer.warm_start.checkpoint={tmp_path}").settings.trainer.warm_start
    assert (reused.enabled, reused.teacher, reused.checkpoint) == (True, "label", str(tmp_path))
    arith = _plan(tmp_path, "env=arith", "trainer.warm_start.teacher=optimal").settings.trainer.warm_start
    assert (arith.enabled, arith.teacher) == (True, "optimal")  # arith offers optimal too


def test_the_teacher_is_read_from_the_typed_trainer_settings() -> None:
    from agentrl.config.trainer import (
        GRPOTrainerConfig,
        MilesTrainerConfig,
        SFTTrainerConfig,
        TRLTrainerConfig,
        WarmStartConfig,
    )
    from agentrl.trainers.sft.warm_start import teacher_setting

    assert teacher_setting(SFTTrainerConfig(teacher="greedy")) == ("trainer.teacher", "greedy")
    assert teacher_setting(GRPOTrainerConfig()) == ("trainer.warm_start.teacher", "optimal")
    assert teacher_setting(TRLTrainerConfig(warm_start=WarmStartConfig(teacher="label"))) == \
        ("trainer.warm_start.teacher", "label")
    assert teacher_setting(GRPOTrainerConfig(warm_start=WarmStartConfig(checkpoint="/mine"))) is None
    assert teacher_setting(GRPOTrainerConfig(warm_start=WarmStartConfig(enabled=False))) is None
    assert teacher_setting(MilesTrainerConfig()) is None  # Miles makes no warm start


@pytest.mark.slow
def test_a_warm_start_is_logged_to_the_grpo_run_and_reused_by_the_next(tmp_path: Path, capsys) -> None:
    from agentrl.trainers.sft.warm_start import warm_start_path

    plan = _plan(tmp_path, "+recipe=gridsim_grpo", *SMALL, "trainer.warm_start.steps=10",
                 "trainer.warm_start.batch_samples=2", "trainer.warm_start.augment=0")
    tracker = _Tracker()
    path = warm_start_path(plan, tracker)
    assert (Path(path) / "config.json").is_file()
    assert [step for step, _ in tracker.logged["warm_start/loss"]] == [10]
    assert {"warm_start/eval/reward", "warm_start/eval/reward_stderr", "warm_start/eval/zero_share",
            "time/warm_start_total_s"} <= set(tracker.logged)
    assert "eval/reward" not in tracker.logged and "sft/loss" not in tracker.logged  # GRPO's own names stay free
    assert tracker.tags == {"agentrl.warm_start": path, "agentrl.warm_start.reused": "false"}
    assert "warm_start/eval/reward" in capsys.readouterr().out  # the eval's one line

    again = _Tracker()
    assert warm_start_path(plan, again) == path
    assert again.logged == {} and again.tags == {"agentrl.warm_start": path, "agentrl.warm_start.reused": "true"}


@pytest.mark.slow
def test_a_warm_start_without_its_own_eval_logs_no_eval(tmp_path: Path, capsys) -> None:
    # trainer.warm_start.eval=false: the trainer's step-0 eval plays the same weights, so none is played here.
    from agentrl.plan import describe_stages
    from agentrl.trainers.sft.warm_start import warm_start_path

    plan = _plan(tmp_path, "+recipe=gridsim_grpo", *SMALL, "trainer.warm_start.steps=2",
                 "trainer.warm_start.batch_samples=2", "trainer.warm_start.augment=0", "trainer.warm_start.eval=false")
    assert "then evaluated" not in describe_stages(plan.settings, "grpo")
    tracker = _Tracker()
    path = warm_start_path(plan, tracker)
    assert (Path(path) / "config.json").is_file()
    assert not any(key.startswith("warm_start/eval") for key in tracker.logged)
    assert "time/warm_start_total_s" in tracker.logged and tracker.traces == []
    assert not (tmp_path / "run" / "evals").exists()
    assert "warm_start/eval" not in capsys.readouterr().out
    on = _plan(tmp_path, "+recipe=gridsim_grpo", *SMALL)
    assert "then evaluated" in describe_stages(on.settings, "grpo")


@pytest.mark.slow
def test_sft_fit_returns_the_closing_keys_and_logs_its_model(tmp_path: Path, capsys) -> None:
    from agentrl.trainers.sft.trainer import SFTTrainer

    plan = _plan(tmp_path, "+recipe=gridsim_sft", *SMALL, "trainer.steps=2", "trainer.batch_samples=2",
                 "trainer.augment=0", "trainer.eval_every=0")
    tracker = _Tracker()
    trainer = SFTTrainer(plan=plan, tracker=tracker)
    metrics = trainer.fit()
    for key in ("eval/reward", "eval_greedy/reward", "time/train_total_s", "time/eval_total_s", "sft/loss"):
        assert key in metrics, key
    assert metrics["time/train_total_s"] > 0 and metrics["time/eval_total_s"] > 0
    assert tracker.models == [trainer.output_dir]
    out = capsys.readouterr().out
    assert "step 2 eval/reward" in out and "step 2 eval_greedy/reward" in out


def test_a_moved_home_keeps_its_warm_starts_and_one_keyed_by_the_old_path_is_still_found(tmp_path: Path) -> None:
    from agentrl.trainers.sft.trainer import model_key, sft_checkpoint_path
    from agentrl.trainers.sft.warm_start import warm_start_path

    flagship = ("+recipe=gridsim_grpo", *SMALL)
    a, b = (_plan(tmp_path / home, *flagship) for home in ("a", "b"))
    key_a, key_b = (sft_checkpoint_path(p.settings, p.settings.trainer.warm_start, p.bundle, p.agent) for p in (a, b))
    assert key_a.parent != key_b.parent and key_a.name == key_b.name  # the tiny model named by its folder name
    # The key before: the tiny model's absolute path, which differs between the two homes.
    legacy = sft_checkpoint_path(b.settings, b.settings.trainer.warm_start, b.bundle, b.agent, legacy=True)
    assert legacy.parent == key_b.parent and legacy.name != key_b.name
    legacy.mkdir(parents=True)
    (legacy / "config.json").write_text("{}")
    tracker = _Tracker()
    assert warm_start_path(b, tracker) == str(legacy)  # found, not made again
    assert tracker.tags == {"agentrl.warm_start": str(legacy), "agentrl.warm_start.reused": "true"}
    key_b.mkdir(parents=True)  # a folder under the new key wins
    (key_b / "config.json").write_text("{}")
    assert warm_start_path(b, _Tracker()) == str(key_b)
    # A model outside paths.model_dir keeps its path in the key: two such folders never share a warm start.
    run = b.settings
    assert model_key(run) == Path(run.model.path).name
    assert model_key(replace(run, model=replace(run.model, path=str(tmp_path / "m1")))) == str(tmp_path / "m1")


def test_a_lora_warm_start_made_on_demand_is_warned_of(tmp_path: Path) -> None:
    # An SFT warm start under model.lora trains only the adapter, at the warm start's full fine-tuning rate.
    def warned(*overrides: str) -> bool:
        return any("trains only the LoRA adapter" in n for n in _plan(tmp_path, "+recipe=gridsim_grpo", *overrides).notes)

    assert warned("model.lora.enabled=true")
    assert not warned("model.lora.enabled=true", f"trainer.warm_start.checkpoint={tmp_path}")  # a folder given
    assert not warned("model.lora.enabled=true", "trainer.warm_start.enabled=false")
    assert not warned()  # the whole model trains
