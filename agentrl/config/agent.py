"""Schemas of the `agent` group: how a rollout plays an episode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    """How every pattern plays: its own home for these knobs (trainers and rows read them from `agent`)."""

    _target_: str = MISSING
    max_turns: int = 4  # model turns per episode (all roles counted, for patterns that alternate)
    # Whole conversation; the episode ends flagged when the next turn won't fit (null: no budget).
    max_context_tokens: int | None = 4096
    max_response_tokens: int | None = 512  # per model turn (null: the endpoint's default)
    model_timeout: float = 600.0  # seconds for one model reply
    # Healthy ranges of the run's metrics, metric -> [low, high] (e.g. multi_agent/avg_turns: [1, 2]); the GRPO
    # run's end prints one line flagging any outside (agentrl/trainers/grpo/health.py). {}: nothing checked.
    health: dict[str, list[Any]] = field(default_factory=dict)  # numbers; checked below (ints allowed)

    def __post_init__(self) -> None:
        if int(self.max_turns) < 1:
            raise ValueError(f"agent.max_turns must be at least 1, not {self.max_turns}")
        for name in ("max_context_tokens", "max_response_tokens"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise ValueError(f"agent.{name} must be at least 1 (or null), not {value}")
        if not float(self.model_timeout) > 0:
            raise ValueError(f"agent.model_timeout must be positive, not {self.model_timeout}")
        for metric, bounds in (self.health or {}).items():
            numbers = len(bounds) == 2 and all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
            if not numbers or float(bounds[0]) > float(bounds[1]):
                raise ValueError(f"agent.health.{metric} must be [low, high] with low <= high, not {list(bounds)}")

    def role_list(self) -> list[RoleConfig]:
        """The pattern's roles (`agent.roles`, a multi-role pattern's); [] for a single-agent pattern."""
        return []


@dataclass
class MultiRoleAgentConfig(AgentConfig):
    """A pattern whose episode is played by named roles, each with its prompt and, optionally, its own model."""

    roles: list[RoleConfig] = field(default_factory=list)

    def role_list(self) -> list[RoleConfig]:
        return list(self.roles)


@dataclass
class ToolCallingAgentConfig(AgentConfig):
    _target_: str = "agentrl.agents.tool_calling.ToolCallingAgent"


@dataclass
class CoEvolutionAgentConfig(MultiRoleAgentConfig):
    _target_: str = "agentrl.agents.co_evolution.CoEvolutionAgent"
    num_parallel: int = 5  # solvers, and rewriters, per prompt
    # How the selector picks: "judgment" (Miles: it replies `Judgment: IDX` and takes that rewrite's score) or
    # "answer" (it plays the episode itself, restating the rewrite it picks, and the env grades its answer; a
    # model warm-started on the task can play this from its first step, as it never learned the Judgment format).
    selection: str = "judgment"
    # Where the rewriters' and selector's candidate block goes in their user message: "after" the task (Miles'
    # layout) or "before" it, so the prompt still ends like the solver's (a small warm-started model answers the
    # task it was trained on instead of continuing the candidates' text).
    candidates: str = "after"
    # The wrong candidates the SFT warm start shows the rewriters and the selector: "far" (an answer reversed
    # with its signs flipped, idle, or an integer moved by a quarter: told apart at a glance) or "near" (a local
    # edit or two of the teacher's answer, `demos.near_miss`: the close mistakes a warm-started solver makes,
    # meant to teach the rewriter to repair candidates; measured on GridSim, every role ends worse: RESULTS.md).
    demo_candidates: str = "far"
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

    def __post_init__(self) -> None:
        super().__post_init__()
        if int(self.num_parallel) < 1:
            raise ValueError(f"agent.num_parallel must be at least 1, not {self.num_parallel}")
        if self.candidates not in ("after", "before"):
            raise ValueError(f"agent.candidates must be after or before, not {self.candidates!r}")
        if self.selection not in ("judgment", "answer"):
            raise ValueError(f"agent.selection must be judgment or answer, not {self.selection!r}")
        if self.demo_candidates not in ("far", "near"):
            raise ValueError(f"agent.demo_candidates must be far or near, not {self.demo_candidates!r}")


@dataclass
class ThinkerVerifierAgentConfig(MultiRoleAgentConfig):
    _target_: str = "agentrl.agents.thinker_verifier.ThinkerVerifierAgent"
    max_turns: int = 6
    # "verdict": the verifier accepts by replying ACCEPT; "agreement": also when it re-solves the task to the same
    # final answer (any of <final_answer>, \boxed{} or `Answer:`): a model warm-started on answers can verify.
    accept: str = "verdict"
    roles: list[RoleConfig] = field(
        default_factory=lambda: [
            RoleConfig(name="thinker", prompt="Think step by step; propose <final_answer>X</final_answer>."),
            RoleConfig(
                name="verifier",
                prompt="Check the proposal. Reply ACCEPT to accept it, or explain the mistake.",
            ),
        ]
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.accept not in ("verdict", "agreement"):
            raise ValueError(f"agent.accept must be verdict or agreement, not {self.accept!r}")


@dataclass
class AdversarialAgentConfig(MultiRoleAgentConfig):
    _target_: str = "agentrl.agents.adversarial.AdversarialAgent"
    roles: list[RoleConfig] = field(
        default_factory=lambda: [
            RoleConfig(name="proposer", prompt="Write a harder variant of this problem with an integer answer."),
            RoleConfig(name="solver", prompt="Solve the problem. End with \\boxed{answer}."),
        ]
    )


@dataclass
class SelfPlayAgentConfig(MultiRoleAgentConfig):
    """Every seat of a multi-player game (env=textarena): seat n is played by the n-th role, each role its own
    conversation; roles on the shared policy are one model playing itself, a role's `model` makes it two."""

    _target_: str = "agentrl.agents.self_play.SelfPlayAgent"
    max_turns: int = 12  # moves of all seats together (TicTacToe: at most 9, plus retried invalid moves)
    max_response_tokens: int | None = 16  # a move is a few tokens
    roles: list[RoleConfig] = field(
        default_factory=lambda: [
            RoleConfig(name="player_0", prompt=""),
            RoleConfig(name="player_1", prompt=""),
        ]
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.roles:
            raise ValueError("agent.roles must name at least one role (one per seat of the game)")
