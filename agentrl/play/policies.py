"""The models a run plays: the shared policy `main` and one policy per distinct role `model`.

A role with `model: null` plays the shared policy. A role whose `model` is a local Hugging Face folder plays
that model, on its own engine and session server; roles naming the same folder share it. Such a policy is
trained (its own `Learner`, its own AdamW) unless every role playing it is `frozen`; it is then played but
never updated. A `model` that is an `http(s)://` URL is an external OpenAI-compatible endpoint (its base URL,
without `/v1`): played, never recorded, never trained. Every sample updates only the policy that played it.
Who plays what lives here (training and `agentrl eval` both route roles by it); how a trained policy learns,
updates and pushes is the GRPO trainer's (`trainers/grpo/policy_steps.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAIN = "main"


def is_endpoint(model: str) -> bool:
    """True for an external OpenAI-compatible endpoint (an http(s) URL) rather than a model folder."""
    return model.startswith(("http://", "https://"))


@dataclass
class Policy:
    """A model the run plays: where it comes from, who plays it, and (when trained) its learner."""

    name: str
    source: str  # where it starts: the run's start folder (main), a role's model folder or endpoint URL
    roles: list[str] = field(default_factory=list)
    trainable: bool = False
    path: str = ""  # where its weights load from now: `source`, or the resumed checkpoint's copy
    tokenizer: Any = None
    learner: Any = None  # a trained policy's `Learner` (trainers/grpo/learner.py), given by `load_learners`

    @property
    def external(self) -> bool:
        return is_endpoint(self.source)


def _get(entry: Any, key: str, default: Any = None) -> Any:
    return entry.get(key, default) if hasattr(entry, "get") else getattr(entry, key, default)


def plan_policies(roles: Iterable[Any] | None) -> list[Policy]:
    """One `Policy` per distinct role `model` (in order of first use); roles without a model play `main`.

    Raises FileNotFoundError for a model that is neither an existing folder nor an http(s) URL.
    """
    by_source: dict[str, Policy] = {}
    for role in roles or []:
        model, name = _get(role, "model"), str(_get(role, "name"))
        if not model:
            continue
        model = str(model).rstrip("/")
        if is_endpoint(model):
            model = model.removesuffix("/v1")  # the agent appends /v1/chat/completions itself
        elif not Path(model).is_dir():
            raise FileNotFoundError(f"role {name!r}: model {model!r} is neither a model folder nor an http(s):// "
                                    "URL of an OpenAI-compatible endpoint")
        policy = by_source.get(model)
        if policy is None:
            # Named after the first role that plays it; `main` is the shared policy's name.
            policy = by_source[model] = Policy(name if name != MAIN else f"role_{name}", model, path=model)
        policy.roles.append(name)
        if not _get(role, "frozen", False) and not is_endpoint(model):
            policy.trainable = True
    return list(by_source.values())


def routing(policies: Sequence[Policy], servers: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The runner's maps: `routes` (role -> session server), `external` (role -> endpoint), `role_policy`.

    `servers` holds the session server URL of every policy that is not external.
    """
    routes, external, role_policy = {}, {}, {}
    for p in policies:
        for role in p.roles:
            role_policy[role] = p.name
            if p.external:
                external[role] = p.source
            else:
                routes[role] = servers[p.name]
    return {"routes": routes, "external": external, "role_policy": role_policy}


def untrained_roles(policies: Sequence[Policy]) -> list[str]:
    """Roles whose policy is never updated (all its roles frozen, or an external endpoint)."""
    return [r for p in policies if not p.trainable for r in p.roles]


def main_policy(path: str) -> Policy:
    """The shared policy, starting from `path`: played by every role without a model of its own, always trained."""
    return Policy(MAIN, path, trainable=True, path=path)
