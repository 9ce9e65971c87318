"""Schemas of the `agent` group: how a rollout plays an episode."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class RoleConfig:
    name: str = MISSING
    prompt: str = ""
    # null: the run's shared policy model; else a model path or an OpenAI-compatible base URL for this role.
    model: str | None = None
    frozen: bool = False  # played but never updated


@dataclass
class AgentConfig:
    _target_: str = MISSING
    # Model turns per episode: the trainer's `max_turns` when it has one (GRPO, Miles), else 4.
    max_turns: int = "${oc.select:trainer.max_turns,4}"  # type: ignore[assignment]
    max_context_tokens: int = 4096  # whole conversation; the episode ends flagged when the next turn won't fit
    max_response_tokens: int = 512  # per model turn
    model_timeout: float = 600.0  # seconds for one model reply


@dataclass
class ToolCallingAgentConfig(AgentConfig):
    _target_: str = "agentrl.agents.tool_calling.ToolCallingAgent"


@dataclass
class CoEvolutionAgentConfig(AgentConfig):
    _target_: str = "agentrl.agents.co_evolution.CoEvolutionAgent"
    num_parallel: int = 5  # solvers, and rewriters, per prompt
    roles: list[RoleConfig] = field(
        default_factory=lambda: [
            RoleConfig(name="solver", prompt="Solve the problem. End with \\boxed{answer}."),
            RoleConfig(
                name="rewriter",
                prompt="Here are candidate solutions. Write one improved solution. End with \\boxed{answer}.",
            ),
            RoleConfig(
                name="selector",
                prompt="Pick the best rewritten solution. Reply with 'Judgment: IDX' (0-based).",
            ),
        ]
    )


@dataclass
class ThinkerVerifierAgentConfig(AgentConfig):
    _target_: str = "agentrl.agents.thinker_verifier.ThinkerVerifierAgent"
    max_turns: int = 6
    roles: list[RoleConfig] = field(
        default_factory=lambda: [
            RoleConfig(name="thinker", prompt="Think step by step; propose <final_answer>X</final_answer>."),
            RoleConfig(
                name="verifier",
                prompt="Check the proposal. Reply ACCEPT to accept it, or explain the mistake.",
            ),
        ]
    )


@dataclass
class AdversarialAgentConfig(AgentConfig):
    _target_: str = "agentrl.agents.adversarial.AdversarialAgent"
    roles: list[RoleConfig] = field(
        default_factory=lambda: [
            RoleConfig(name="proposer", prompt="Write a harder variant of this problem with an integer answer."),
            RoleConfig(name="solver", prompt="Solve the problem. End with \\boxed{answer}."),
        ]
    )
