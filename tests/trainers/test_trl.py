"""`trainer=trl` for real: TRL's GRPOTrainer through the CLI, one process and two (accelerate, gloo), the
GRPOConfig mapping, and the refusals at plan time. The tiny model's warm start (150 SFT steps) is made once
and shared, so sampled plays at T=0.6 score unequally and a step has a gradient to agree on."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.agent import CoEvolutionAgentConfig, RoleConfig, ToolCallingAgentConfig
from agentrl.config.model import TinyModelConfig
from agentrl.config.schema import RunConfig
from agentrl.config.trainer import TRLTrainerConfig
from agentrl.plan import Plan
from agentrl.testing.cli import run_agentrl
from agentrl.trainers.trl.trainer import TRLTrainer

SMALL = ["+recipe=gridsim_grpo", "trainer=trl", "trainer.prompts_per_step=4", "trainer.samples_per_prompt=4",
         "trainer.temperature=0.6", "trainer.eval_limit=8", "trainer.eval_every=1", "trainer.checkpoint_every=0",
         "trainer.warm_start.steps=150", "trainer.warm_start.batch_samples=8", "model.hidden_size=32",
         "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64",
         "model.vocab_size=1024"]
REQUIRED = ["train/reward", "eval/reward", "eval/reward_stderr", "eval/zero_share", "eval_greedy/reward",
            "rollout/flagged", "rollout/invalid_tool_calls", "rollout/groups_dropped", "rollout/model_tokens",
            "train/loss", "train/grad_norm", "train/kl", "train/clip_fraction", "train/tokens", "time/generate_s",
            "time/train_s", "time/step_s", "time/weight_push_s", "trl/loss", "trl/reward", "trl/learning_rate",
            "train/updates"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trl") / "home"


def _cli(args: list[str], home: Path, timeout: float = 1500) -> subprocess.CompletedProcess:
    return run_agentrl(args, home, timeout=timeout, check=False).process


def _run(home: Path, stdout: str) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    run_id = re.findall(r"MLflow\s+\S+\s+experiment \S+\s+run (\w+)", stdout)[-1]
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    return client, client.get_run(run_id)


@pytest.mark.slow
def test_two_steps_through_the_cli_log_finite_metrics(home: Path) -> None:
    done = _cli([*SMALL, "trainer.steps=2"], home)
    assert done.returncode == 0, done.stderr[-4000:]
    client, run = _run(home, done.stdout)
    for key in REQUIRED:
        assert key in run.data.metrics, f"{key} missing; logged: {sorted(run.data.metrics)}"
        assert math.isfinite(run.data.metrics[key]), key
    evals = client.get_metric_history(run.info.run_id, "eval/reward")
    assert sorted(m.step for m in evals) == [0, 1, 2]  # before step 1, then after each (eval_every=1)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/reward")) == [1, 2]
    assert run.data.tags["agentrl.backend"] == "trl"
    assert run.data.tags["agentrl.warm_start.reused"] in ("true", "false")
    assert "plots/reward_curves.png" in [a.path for a in client.list_artifacts(run.info.run_id, "plots")]


def _digests(run_dir: Path) -> list[dict[str, list[float]]]:
    return [json.loads((run_dir / f"trl_rank{r}_weights.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_two_processes_train_and_agree_on_the_weights(home: Path) -> None:
    from safetensors.torch import load_file

    done = _cli([*SMALL, "trainer.steps=2", "trainer.num_processes=2"], home)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "accelerate.commands.launch" in done.stdout and "--num_processes 2" in done.stdout
    client, run = _run(home, done.stdout)
    run_dir = Path(re.findall(r"run folder\s+(\S+)", done.stdout)[-1])
    rank0, rank1 = _digests(run_dir)
    assert rank0.keys() == rank1.keys()
    for key in rank0:  # data parallel: both ranks applied the same all-reduced update
        assert rank0[key] == pytest.approx(rank1[key], rel=1e-5, abs=1e-6), key
    grads = [m.value for m in client.get_metric_history(run.info.run_id, "train/grad_norm")]
    assert any(g > 0 for g in grads), f"no step had a gradient: {grads}"
    start = load_file(str(Path(run.data.tags["agentrl.warm_start"]) / "model.safetensors"))
    moved = [k for k, v in start.items() if k in rank0 and abs(float(v.double().sum()) - rank0[k][0]) > 1e-6]
    assert moved, "the two-process run did not change the weights"
    assert math.isfinite(run.data.metrics["eval/reward"]) and "eval_greedy/reward" in run.data.metrics


def test_a_setting_trl_lacks_fails_at_plan_time(tmp_path: Path) -> None:
    done = _cli(["+recipe=gridsim_grpo", "trainer=trl", "trainer.max_extra_rows=16"], tmp_path / "home", timeout=600)
    assert done.returncode != 0
    assert "trainer.max_extra_rows=16 has no counterpart in TRL" in done.stderr
    assert not (tmp_path / "home" / "outputs" / "checkpoints").exists()  # refused before any warm start


def test_dry_run_prints_the_grpo_config_and_the_launch(tmp_path: Path) -> None:
    done = _cli(["+recipe=gridsim_grpo", "trainer=trl", "trainer.num_processes=2", "dry_run=true"],
                tmp_path / "home", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trl: GRPOConfig(" in done.stdout and "num_generations=8," in done.stdout
    assert "generation_batch_size=32," in done.stdout and "per_device_train_batch_size=8," in done.stdout
    assert "gradient_accumulation_steps=2," in done.stdout  # 32 completions / 2 processes / micro-batch 8
    launch = next(line for line in done.stdout.splitlines() if line.startswith("launch: "))
    assert "accelerate.commands.launch --multi_gpu" in launch and "-m agentrl.trl_rank" in launch


def _settings(agent: Any = None, **trainer: Any) -> RunConfig:
    """Typed settings as the plan holds them (`Plan.settings`): the TRL trainer's, a tool-calling agent's, a
    model's; the groups trainers/trl/args.py does not read stay unset."""
    return RunConfig(seed=3, trainer=TRLTrainerConfig(**trainer),
                     agent=agent or ToolCallingAgentConfig(max_turns=4, max_response_tokens=96),
                     model=TinyModelConfig())


def _plan(settings: RunConfig) -> Plan:
    """A plan holding only what the bridge reads here: its typed settings and reward (no env, agent or services)."""
    from agentrl.rewards import EnvScore

    return Plan(choices={}, run_dir=Path("unused"), bundle=None, agent=None, reward=EnvScore(),
                trainer_cls=TRLTrainer, settings=settings)


def test_overlapped_rollouts_are_the_built_in_trainers_only() -> None:
    from agentrl.trainers.trl.args import TRLConfigError, check_config

    with pytest.raises(TRLConfigError, match=r"trainer.max_staleness=1 has no counterpart in TRL.*AsyncGRPOTrainer"):
        check_config(_settings(max_staleness=1))


def test_mapping_builds_a_real_grpo_config() -> None:
    from trl import GRPOConfig

    from agentrl.trainers.trl.args import grpo_config_kwargs

    settings = _settings(lr=5e-5, steps=7, clip_high=0.28, kl_coef=0.01, loss="gspo", micro_batch_samples=4,
                         extra_args={"mask_truncated_completions": True})
    kwargs = grpo_config_kwargs(settings, output_dir="/tmp/x", cpu=True)
    args = GRPOConfig(**kwargs)
    assert (args.learning_rate, args.max_steps, args.num_generations) == (5e-5, 7, 8)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 8)
    assert (args.epsilon, args.epsilon_high, args.beta) == (0.2, 0.28, 0.01)
    assert (args.loss_type, args.importance_sampling_level, args.scale_rewards) == ("grpo", "sequence", "group")
    assert args.mask_truncated_completions and args.max_completion_length == 4 * 96
    dr = grpo_config_kwargs(_settings(loss="dr_grpo"), output_dir="/tmp/x", cpu=True)
    assert (dr["loss_type"], dr["scale_rewards"]) == ("dr_grpo", "none")


@pytest.mark.parametrize(("trainer", "agent", "named"), [
    ({"advantage": "rloo"}, {}, "trainer.advantage=rloo"),
    ({"loss": "ppo"}, {}, "trainer.loss='ppo'"),
    ({"num_processes": 3}, {}, "trainer.num_processes=3"),
    ({"micro_batch_samples": 5}, {}, "trainer.micro_batch_samples=5"),
    ({"extra_args": {"not_a_field": 1}}, {}, "not_a_field"),
    ({"extra_args": {"beta": 0.1}}, {}, "beta"),
    ({}, {"roles": [RoleConfig(name="solver"), RoleConfig(name="selector")]}, "2 roles (solver, selector)"),
])
def test_refusals_name_the_key(trainer: dict, agent: dict, named: str) -> None:
    from agentrl.trainers.trl.args import TRLConfigError, check_config

    settings = _settings(CoEvolutionAgentConfig(**agent) if agent else None, **trainer)
    with pytest.raises(TRLConfigError, match=re.escape(named)):
        check_config(settings)


def test_a_play_becomes_trl_fields(tmp_path: Path) -> None:
    """Prompt before the first model turn, the rest as completion with our mask; a failed group trains nothing;
    a play with nothing recorded still gives TRL a non-empty, fully masked completion."""
    from transformers import AutoTokenizer

    from agentrl.agents.record import Failure, Rollout
    from agentrl.inference.sessions.samples import Sample
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.trainers.trl.worker import Bridge

    path = ensure_tiny_model(str(tmp_path / "tiny"), vocab_size=512, hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1, intermediate_size=64)
    tok = AutoTokenizer.from_pretrained(path)
    bridge = Bridge(_plan(_settings()), services=None, tokenizer=tok, sink=None)
    sample = Sample([5, 6, 7, 8, 9, 10, 11], [0, 0, 1, 1, 0, 1, 1], [0, 0, -0.5, -0.2, 0, -0.1, -0.3],
                    turn_boundaries=[(2, 4), (5, 7)])
    played = Rollout(reward=0.75, sample=sample)
    fields = bridge._completion(played, train=True)
    assert fields == {"prompt_ids": [5, 6], "completion_ids": [7, 8, 9, 10, 11], "env_mask": [1, 1, 0, 1, 1],
                      "logprobs": [-0.5, -0.2, 0.0, -0.1, -0.3], "reward": 0.75}
    assert bridge._completion(played, train=False)["env_mask"] == [0] * 5
    empty = Rollout(sample=Sample([], [], []), row={"messages": [{"role": "user", "content": "hi"}],
                                                     "metadata": {"tools": None}})
    empty.flag(Failure.NO_MODEL_TURN, "nothing recorded")
    fields = bridge._completion(empty, train=True)
    assert fields["prompt_ids"] and fields["completion_ids"] == [tok.eos_token_id]
    assert fields["env_mask"] == [0] and fields["reward"] == 0.0


def test_penalized_cut_plays_train_in_their_group_and_env_failures_still_mask_it() -> None:
    """trainer.model_failures under TRL: drop masks a group holding a cut play; penalize trains it (the cut play
    at reward 0 among the others); an env failure masks its group either way."""
    from agentrl.agents.record import Failure
    from agentrl.config.trainer import TRLTrainerConfig
    from agentrl.trainers.trl.worker import train_plan

    cut = _played(0.0, [1, 1])
    cut.flag(Failure.TRUNCATED, "the reply hit max_response_tokens")
    cut_group, env_group = [_played(1.0, [1]), cut], [_played(1.0, [1]), _played(0.0, [1], failed=True)]
    reasons, masked = train_plan([cut_group, env_group], drop_no_signal=True, penalize=False)
    assert reasons == ["failed", "failed"] and masked == {id(r) for r in cut_group + env_group}
    reasons, masked = train_plan([cut_group, env_group], drop_no_signal=True, penalize=True)
    assert reasons == [None, "failed"] and masked == {id(r) for r in env_group}
    assert TRLTrainerConfig(model_failures="penalize").model_failures == "penalize"
    with pytest.raises(ValueError, match="trainer.model_failures must be drop or penalize"):
        TRLTrainerConfig(model_failures="ignore")


def _played(reward: float, mask: list[int], *, failed: bool = False, group: str = "a") -> Any:
    from agentrl.agents.record import Failure, Rollout
    from agentrl.inference.sessions.samples import Sample

    rollout = Rollout(reward=reward, sample=Sample([1, 2, *range(3, 3 + len(mask))], [0, 0, *mask],
                                                   [0.0] * (2 + len(mask))),
                      row={"messages": [], "metadata": {"task": {"bundle": group}}})
    if failed:
        rollout.flag(Failure.ENV_ERROR, "the episode's code failed")
    return rollout


def test_a_trl_step_reports_step_stats_as_the_grpo_step_does() -> None:
    """rollout_func's plays, the step's end and TRL's log of its update make one `StepStats`: a failed group is
    dropped, TRL's loss is train/loss, the sink gets `as_metrics()`; a step whose every group dropped trained
    nothing (train/updates 0); TRL's closing summary is forwarded under trl/ alone."""
    from collections import Counter

    from transformers import TrainerControl, TrainerState

    from agentrl.group_filter import FAILED
    from agentrl.trainers.common.step_products import StepStats
    from agentrl.trainers.trl.steps import gather_step, make_callback
    from agentrl.trainers.trl.worker import Bridge

    sent: list[tuple[int, dict[str, float]]] = []
    bridge = Bridge(_plan(_settings(steps=5, eval_every=0)), services=None, tokenizer=None,
                    sink=lambda metrics, step: sent.append((step, metrics)))
    kept = [_played(1.0, [1, 1]), _played(0.0, [1, 0])]
    failed = [_played(0.0, [1, 1], failed=True, group="b"), _played(0.0, [1, 1], failed=True, group="b")]
    bridge.played = gather_step(1, [kept, failed], [None, FAILED], trained_tokens=3, push_s=0.0, generate_s=0.5,
                                played_from=0, row_cursor=4, breakdown={"bundle": "reward/{}"})
    callback, control = make_callback(bridge, [None]), TrainerControl()
    state = TrainerState(global_step=1, is_world_process_zero=True)
    callback.on_step_begin(None, state, control)
    callback.on_step_end(None, state, control)
    callback.on_log(None, state, control, logs={"loss": 0.25, "grad_norm": 0.5, "learning_rate": 1e-6})

    stats = bridge.stats
    assert isinstance(stats, StepStats) and stats.step == 1 and stats.updates == 1.0
    assert stats.batch.dropped == Counter({FAILED: 1})
    assert [[r.reward for r in g] for g in stats.batch.kept] == [[1.0, 0.0]]
    step, metrics = sent[-1]
    assert step == 1 and metrics == stats.as_metrics()
    assert metrics["train/reward"] == 0.25 and metrics["rollout/flagged"] == 0.5
    assert (metrics["train/reward/a"], metrics["train/reward/b"]) == (0.5, 0.0)  # env=mix's per-bundle rewards
    assert (metrics["rollout/rows_drawn"], metrics["rollout/groups_kept"], metrics["rollout/groups_dropped"]) == \
        (2.0, 1.0, 1.0)
    assert metrics["rollout/model_tokens"] == 7.0 and metrics["train/tokens"] == 3.0  # the gather kept the masks
    assert (metrics["train/loss"], metrics["train/grad_norm"], metrics["train/kl"]) == (0.25, 0.5, 0.0)
    assert metrics["trl/learning_rate"] == 1e-6 and metrics["time/generate_s"] == 0.5
    assert metrics["time/step_s"] >= 0 and metrics["time/weight_push_s"] == 0.0
    assert bridge.history["train/reward"] == [(1, 0.25)]

    callback.on_log(None, state, control, logs={"train_runtime": 3.0})
    assert sent[-1] == (1, {"trl/train_runtime": 3.0})

    bridge.played = gather_step(2, [failed], [FAILED], trained_tokens=0, push_s=0.1, generate_s=0.5,
                                played_from=1, row_cursor=8)
    state.global_step = 2
    callback.on_step_begin(None, state, control)
    callback.on_step_end(None, state, control)
    callback.on_log(None, state, control, logs={"loss": 0.0, "grad_norm": 0.0})
    assert bridge.stats.step == 2 and bridge.stats.updates == 0.0 and sent[-1][1]["train/updates"] == 0.0
