"""Per-role credit assignment: `trainer.advantage=per_role`, `rae` and `hierarchical` (docs/training.md).

The group advantages of `grpo_math` compare a sample with its (row, role) group only. These three also look
at which role played it, so that roles with different reward scales (co-evolution's 1.2/0.8 weighted solvers,
a zero-sum game's two seats) get each their own baseline and scale:

- `per_role`: r - mean of its (row, role) group, divided by the std of those centred values over every sample
  of the same role in the step (REINFORCE++-baseline's batch normalization, Hu et al. 2025, arXiv:2501.03262,
  taken per role). A small group's spread no longer reads as a full +-1, and each role's advantages end at unit
  scale. A group of one or of equal rewards gets 0, as in `grpo_math`.
- `rae`: role-conditioned advantage estimation (SPIRAL, Liu et al. 2025, arXiv:2506.24119; prime-rl's `rae`):
  r - b_role, with b_role an exponential moving average of the role's past rewards over the run (decay
  `rae_decay`), each sample scored against the baseline before its reward updates it. The baseline starts at 0.
- `hierarchical`: prime-rl's `hierarchical_grpo`: r - mean, where a role in `episode_roles` (the solvers) is
  compared only with the same role's samples of the same play (the same proposed problem), and every other
  role with its (row, role) group.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from agentrl.config.schema import RunConfig, trainer_settings
from agentrl.config.trainer import GRPOTrainerConfig

ROLE_ADVANTAGES = ("per_role", "rae", "hierarchical")


def _rewards(rewards: Sequence[float] | torch.Tensor, n_keys: int, what: str) -> torch.Tensor:
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if n_keys != r.numel():
        raise ValueError(f"{what}: {r.numel()} rewards but {n_keys} keys")
    if not torch.isfinite(r).all():
        raise ValueError(f"{what}: rewards must be finite, got {r.tolist()}")
    return r


def _members(keys: Sequence[Hashable]) -> list[list[int]]:
    out: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return list(out.values())


def _centred(r: torch.Tensor, keys: Sequence[Hashable]) -> torch.Tensor:
    """r - its group's mean; 0 in groups of one or of equal rewards (no baseline, no signal)."""
    out = torch.zeros_like(r)
    for idx in _members(keys):
        sub = r[idx]
        if len(idx) > 1 and bool(sub.max() != sub.min()):
            out[idx] = sub - sub.mean()
    return out


def per_role_advantages(rewards: Sequence[float] | torch.Tensor, groups: Sequence[Hashable],
                        roles: Sequence[str], eps: float = 1e-6) -> torch.Tensor:
    """`per_role` (module docstring): group-centred rewards scaled by each role's std over the step."""
    if len(roles) != len(groups):
        raise ValueError(f"per_role advantages: {len(groups)} group keys but {len(roles)} roles")
    r = _rewards(rewards, len(groups), "per_role advantages")
    centred = _centred(r, groups)
    size = {g: len(idx) for g, idx in zip(dict.fromkeys(groups), _members(groups), strict=True)}
    out = torch.zeros_like(r)
    for idx in _members(roles):
        # Only samples that had a baseline (a group of two or more) count in the role's scale.
        had = [i for i in idx if size[groups[i]] > 1]
        if not had:
            continue
        std = centred[had].std(unbiased=False)
        if float(std) > 0:
            out[idx] = centred[idx] / (std + eps)
    return out.to(torch.float32)


def hierarchical_advantages(rewards: Sequence[float] | torch.Tensor, groups: Sequence[Hashable],
                            roles: Sequence[str], plays: Sequence[Hashable],
                            episode_roles: Sequence[str] = ("solver",)) -> torch.Tensor:
    """`hierarchical` (module docstring): `episode_roles` compared within one play, other roles in their group."""
    if not len(roles) == len(plays) == len(groups):
        raise ValueError(f"hierarchical advantages: {len(groups)} group keys, {len(roles)} roles, "
                         f"{len(plays)} play ids")
    r = _rewards(rewards, len(groups), "hierarchical advantages")
    scoped = set(episode_roles)
    keys = [(g, play) if role in scoped else (g, None) for g, role, play in zip(groups, roles, plays, strict=True)]
    return _centred(r, keys).to(torch.float32)


class RoleBaselines:
    """`rae`'s state: one EMA baseline of the rewards per role, carried from step to step of a run."""

    def __init__(self, decay: float = 0.95) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"rae_decay must be in [0, 1) (the baseline's weight on its past), got {decay}")
        self.decay = float(decay)
        self.baselines: dict[str, float] = {}

    def advantages(self, rewards: Sequence[float] | torch.Tensor, roles: Sequence[str]) -> torch.Tensor:
        """r - b_role for each sample in order, each scored before its reward moves its role's baseline."""
        r = _rewards(rewards, len(roles), "rae advantages")
        out = torch.zeros_like(r)
        for i, role in enumerate(roles):
            b = self.baselines.get(role, 0.0)
            out[i] = r[i] - b
            self.baselines[role] = self.decay * b + (1.0 - self.decay) * float(r[i])
        return out.to(torch.float32)


def role_advantage_problem(settings: RunConfig) -> str | None:
    """Why `trainer.episode_roles` cannot apply to this run's agent (checked when the plan is built), or None:
    under `advantage=hierarchical` each name must be a role the agent plays (a single-agent pattern's is `agent`)."""
    t = trainer_settings(settings, GRPOTrainerConfig)
    if t.advantage != "hierarchical":
        return None
    roles = [r.name for r in settings.agent.role_list()] or ["agent"]
    unknown = [r for r in t.episode_roles if r not in roles]
    if unknown:
        return (f"trainer.episode_roles={list(t.episode_roles)} names {unknown}, which this agent does not play "
                f"(its roles: {', '.join(roles)}); list the roles to compare within one play, or [] for none")
    return None
