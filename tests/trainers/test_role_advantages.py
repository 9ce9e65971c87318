"""Per-role credit assignment (`trainer.advantage=per_role|rae|hierarchical`) against hand-computed values, with
groups of varying size and frozen roles, and the plan-time refusals of the backends that cannot map them."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.agents.record import Rollout
from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.plan import PlanError, build_plan
from agentrl.testing.config import compose_config
from agentrl.trainers.grpo.learner import Algorithm, Learner, items_from
from agentrl.trainers.grpo.role_advantages import RoleBaselines, hierarchical_advantages, per_role_advantages

# Two rows of co-evolution-like plays: solver groups of 4, 3 and 2 (the last a tie), selectors of 1 and 2.
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.2, 1.2, 0.0]
GROUPS = [("r0", "solver")] * 4 + [("r1", "solver")] * 3 + [("r2", "solver")] * 2 + [("r0", "selector")] \
    + [("r1", "selector")] * 2
ROLES = [g[1] for g in GROUPS]


def test_per_role_centres_in_each_group_and_scales_by_the_role_std() -> None:
    adv = per_role_advantages(REWARDS, GROUPS, ROLES, eps=0.0).tolist()
    # Solvers' centred values: +-1/2 (r0), 2/3, -1/3, -1/3 (r1), 0, 0 (r2's tie); their mean is 0, so the
    # role's std is sqrt((4/4 + 6/9) / 9) = sqrt(5/27), over all 9 solvers (the tie counts, it had a baseline).
    s = math.sqrt(5 / 27)
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, (2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.0, 0.0]
    # Selectors: the lone one has no baseline (0) and stays out of the scale; the pair's +-0.6 has std 0.6.
    expected += [0.0, 1.0, -1.0]
    assert adv == pytest.approx(expected, abs=1e-5)
    # group_norm would have scaled r1's 2/3 by r1's own std (sqrt(2)/3), giving sqrt(2): per_role does not.
    assert adv[4] == pytest.approx(1.5492, abs=1e-3) and adv[4] != pytest.approx(math.sqrt(2), abs=1e-2)


def test_per_role_a_role_without_spread_gets_zero_and_lengths_must_match() -> None:
    assert per_role_advantages([1.0, 1.0, 0.5], [("a", "x")] * 2 + [("a", "y")], ["x", "x", "y"]).tolist() \
        == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="3 group keys but 2 roles"):
        per_role_advantages([1.0, 0.0, 1.0], ["a"] * 3, ["x", "x"])
    with pytest.raises(ValueError, match="finite"):
        per_role_advantages([float("nan"), 0.0], ["a", "a"], ["x", "x"])


def test_rae_scores_against_each_roles_ema_before_updating_it() -> None:
    baselines = RoleBaselines(decay=0.5)
    # Step 1, in order: p0 wins (1 - 0), p1 loses (0 - 0), p0 wins (1 - 0.5), p1 draws (0.5 - 0).
    step1 = baselines.advantages([1.0, 0.0, 1.0, 0.5], ["p0", "p1", "p0", "p1"]).tolist()
    assert step1 == pytest.approx([1.0, 0.0, 0.5, 0.5])
    assert baselines.baselines == pytest.approx({"p0": 0.75, "p1": 0.25})
    # Step 2 carries the baselines over: a lone sample has a baseline too (unlike the group advantages).
    assert baselines.advantages([1.0], ["p0"]).tolist() == pytest.approx([0.25])
    assert baselines.baselines["p0"] == pytest.approx(0.875)
    with pytest.raises(ValueError, match="rae_decay must be in"):
        RoleBaselines(decay=1.0)


def test_hierarchical_compares_solvers_within_one_play_and_proposers_in_their_group() -> None:
    groups = [("r0", "proposer")] * 2 + [("r0", "solver")] * 5
    roles = [g[1] for g in groups]
    plays = ["a", "b", "a", "a", "a", "b", "b"]  # play a's problem: 3 solvers; play b's: 2
    rewards = [0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    adv = hierarchical_advantages(rewards, groups, roles, plays).tolist()
    # Proposers: mean 1/2. Play a's solvers: mean 2/3; play b's solvers tie (0). Across plays the solvers' mean
    # (2/5) would have credited a's wrong solver -2/5 and b's +0: the harder problem no longer counts against them.
    assert adv == pytest.approx([-0.5, 0.5, 1 / 3, 1 / 3, -2 / 3, 0.0, 0.0], abs=1e-6)
    everyone = hierarchical_advantages(rewards, groups, roles, plays, episode_roles=()).tolist()
    assert everyone[2:] == pytest.approx([0.6, 0.6, -0.4, -0.4, -0.4], abs=1e-6)


def _played(reward: float, group: tuple, role: str, play: str = "p", frozen: bool = False) -> Rollout:
    sample = SimpleNamespace(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -1.0])
    return Rollout(reward=reward, group=group, role=role, play_id=play, frozen=frozen, sample=sample)


def test_frozen_roles_count_in_the_baselines_but_do_not_train() -> None:
    played = [_played(1.0, ("r0", "solver"), "solver"), _played(0.0, ("r0", "solver"), "solver"),
              _played(1.0, ("r0", "verifier"), "verifier", frozen=True),
              _played(0.0, ("r0", "verifier"), "verifier", frozen=True)]
    for kind in ("per_role", "hierarchical", "rae"):
        items, adv = items_from(played, algorithm=Algorithm.of(advantage=kind, rae_decay=0.5))
        assert len(items) == 2, kind  # the verifier's samples are left out of the update
        assert [i.advantage for i in items] == pytest.approx(adv.tolist()[:2])
        assert adv.tolist()[2] != 0.0, kind  # ...but they had a baseline of their own
    # rae through items_from: the verifier's 0 came after its 1, so it scored against 0.5 * 1.
    assert items_from(played, algorithm=Algorithm.of(advantage="rae", rae_decay=0.5))[1].tolist() \
        == pytest.approx([1.0, -0.5, 1.0, -0.5])


def test_a_learner_keeps_its_rae_baselines_from_step_to_step() -> None:
    import torch

    learner = Learner(torch.nn.Linear(2, 2), lr=1e-3, algorithm=Algorithm.of(advantage="rae", rae_decay=0.5))
    played = [_played(1.0, ("r0", "p0"), "p0")]
    assert [i.advantage for i in learner.items(played)[0]] == [1.0]
    assert [i.advantage for i in learner.items(played)[0]] == [0.5]  # the baseline moved to 0.5


def test_the_config_takes_each_kind_and_refuses_bad_values_naming_the_key(tmp_path: Path) -> None:
    def algo(*overrides: str) -> Algorithm:
        return Algorithm.from_config(compose_config("+recipe=gridsim_grpo", *overrides).trainer)

    assert algo("trainer.advantage=per_role").advantage == "per_role"
    rae = algo("trainer.advantage=rae", "trainer.rae_decay=0.9")
    assert (rae.advantage, rae.rae_decay) == ("rae", 0.9)
    assert algo("trainer.advantage=hierarchical", "trainer.episode_roles=[solver,rewriter]").episode_roles \
        == ("solver", "rewriter")
    with pytest.raises(ValueError, match=re.escape("trainer.rae_decay must be in [0, 1)")):
        GRPOTrainerConfig(advantage="rae", rae_decay=1.5)
    with pytest.raises(ValueError, match="trainer.advantage=per_role contradicts trainer.loss=dr_grpo"):
        GRPOTrainerConfig(loss="dr_grpo", advantage="per_role")
    cfg = compose_config("+recipe=gridsim_grpo", "trainer.advantage=per_roles")
    with pytest.raises(PlanError, match="trainer.advantage='per_roles'"):
        build_plan(cfg, choices={}, run_dir=tmp_path)


def test_hierarchical_episode_roles_must_be_roles_the_agent_plays(tmp_path: Path) -> None:
    cfg = compose_config("+recipe=arith_co_evolution", "trainer.advantage=hierarchical", "trainer.episode_roles=[solvr]")
    with pytest.raises(PlanError, match=r"trainer.episode_roles=\['solvr'\] names \['solvr'\].*solver, rewriter"):
        build_plan(cfg, choices={}, run_dir=tmp_path)
    single = compose_config("+recipe=gridsim_grpo", "trainer.advantage=hierarchical")  # its one role is `agent`
    with pytest.raises(PlanError, match=r"names \['solver'\], which this agent does not play \(its roles: agent\)"):
        build_plan(single, choices={}, run_dir=tmp_path)


@pytest.mark.parametrize("kind", ["per_role", "rae", "hierarchical"])
def test_miles_and_trl_refuse_the_role_advantages_at_plan_time(tmp_path: Path, kind: str) -> None:
    from agentrl.trainers.trl.args import TRLConfigError, check_config
    from tests.trainers.test_trl import _settings

    cfg = compose_config("+recipe=gridsim_miles", f"trainer.advantage={kind}")
    with pytest.raises(PlanError, match=f"trainer.advantage={kind} does not apply under trainer=miles.*trainer=grpo"):
        build_plan(cfg, choices={}, run_dir=tmp_path)
    with pytest.raises(TRLConfigError, match=f"trainer.advantage={kind} has no counterpart"):
        check_config(_settings(advantage=kind))


def test_rae_baselines_survive_a_checkpoint_and_resume(tmp_path: Path) -> None:
    """The built-in trainer's checkpoint holds each learner's rae baselines; resuming puts them back."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.play.policies import MAIN, Policy
    from agentrl.trainers.grpo.trainer import GRPOTrainer

    path = ensure_tiny_model(str(tmp_path / "tiny"), vocab_size=512, hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1, intermediate_size=64)
    learner = Learner(AutoModelForCausalLM.from_pretrained(path), lr=1e-3,
                      algorithm=Algorithm.of(advantage="rae", rae_decay=0.5))
    learner.items([_played(1.0, ("r0", "p0"), "p0")])  # p0's baseline: 0.5
    # Only what save() and _restore() read of a trainer: its policies, learner, checkpoint folder and cursors.
    trainer = SimpleNamespace(learner=learner, policies=[Policy(MAIN, path, trainable=True, learner=learner)],
                              tokenizer=AutoTokenizer.from_pretrained(path), root=tmp_path / "ck",
                              t=SimpleNamespace(keep_checkpoints=2), record=None, tracker=SimpleNamespace(run_id="r"),
                              trained_cursor=3, history={}, rows=SimpleNamespace(cursor=0))
    GRPOTrainer.save(trainer, 1)
    learner.baselines.baselines = {}  # a fresh process
    assert GRPOTrainer._restore(trainer, tmp_path / "ck" / "step-000001") == 2
    assert learner.baselines.baselines == {"p0": 0.5} and trainer.rows.cursor == 3


def test_the_group_only_function_refuses_the_role_kinds() -> None:
    from agentrl.trainers.grpo.grpo_math import group_advantages

    with pytest.raises(ValueError, match="per_role, rae and hierarchical are role_advantages.py's"):
        group_advantages([1.0, 0.0], ["a", "a"], kind="rae")
