"""The one record of a rollout: what an agent played and how it went, from the agent to every trainer.

Agents fill a `Rollout` per trainable sample (one per role session) and return the play's rollouts as a `Play`;
the reward group (`agentrl.rewards.apply_rewards`) sets each rollout's `score`, `weight` and trained `reward`
(and `judged`, which the `Play` says); the built-in trainer's runner adds the recorded tokens (`sample`), the
GRPO group key and the policy. Miles never sees this
type: its agent function returns `miles_metadata(rollout)`, the dict with the AgentEnv key names, and this module
is those keys' one home (`miles_rollout` reads them back; `miles_rubric_metadata` is what the rubric hook adds).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Failure(enum.StrEnum):
    """Why a rollout was flagged: it scores 0 and its group is dropped from training."""

    BAD_ROW = "bad_row"  # the row lacks what the agent needs (the env server's url)
    DEPLOY = "deploy"  # the episode could not start (reset refused or timed out)
    ENV_AUTH = "env_auth"  # the env server refused the token
    ENV_UNREACHABLE = "env_unreachable"  # nothing listens at the env server's URL
    ENV_GONE = "env_gone"  # the env server's connection dropped mid-episode
    ENV_ERROR = "env_error"  # the episode's code failed
    SANDBOX_ERROR = "sandbox_error"  # the sandbox running the episode failed
    TOOL_TIMEOUT = "tool_timeout"  # a tool call passed its deadline
    MODEL_TIMEOUT = "model_timeout"  # no model reply within model_timeout
    MODEL_GONE = "model_gone"  # the model endpoint could not be reached
    MODEL_ERROR = "model_error"  # the model endpoint answered an error or garbage
    OVER_BUDGET = "over_budget"  # the next turn would not fit max_context_tokens
    TRUNCATED = "truncated"  # a reply hit max_response_tokens
    MAX_TURNS = "max_turns"  # the task wanted more turns than max_turns
    NO_REWARD = "no_reward"  # the episode ended without the scores the reward group needs
    JUDGE_ERROR = "judge_error"  # the reward's LLM judge timed out, failed, or answered without a score
    NO_MODEL_TURN = "no_model_turn"  # nothing was recorded: there is nothing to train on
    AGENT_ERROR = "agent_error"  # a bug in the agent (the message says which)

    @classmethod
    def of(cls, name: str) -> Failure:
        """The failure an env server's `failure` name means (its own names for the same thing included)."""
        aliases = {"reward_error": cls.NO_REWARD, "reset_timeout": cls.DEPLOY, "reset_failed": cls.DEPLOY}
        if name in aliases:
            return aliases[name]
        try:
            return cls(name)
        except ValueError:
            return cls.ENV_ERROR


# Failures of the reward group's own step (a score it cannot use, its LLM judge), after the env graded the episode:
# they zero the shaped score, not the env's grade.
REWARD_FAILURES = frozenset({Failure.NO_REWARD, Failure.JUDGE_ERROR})

# The policy's own doing, not the infrastructure's: a reply past max_response_tokens, a conversation past
# max_context_tokens, a task left unfinished at max_turns. Dropping their groups (`trainer.model_failures=drop`)
# hides them from the gradient, so nothing pushes against them and they can grow unchecked; `penalize` keeps
# them in their group at reward 0, so they get a negative advantage like any other bad answer.
MODEL_FAILURES = frozenset({Failure.TRUNCATED, Failure.OVER_BUDGET, Failure.MAX_TURNS})


@dataclass
class ToolCall:
    """One tool call of a model turn: its arguments, and the env's answer or why it was refused."""

    name: str
    arguments: Any  # the parsed object; the raw text when it was not a JSON object
    answer: str = ""  # the env's answer (its text)
    scores: dict[str, float] | None = None  # the env's scores when the call ended the episode
    invalid: str = ""  # why the call was refused before reaching the env ("" when it was valid)
    start_ns: int = 0  # wall clock (time.time_ns) around the env's answer, for the trace's timeline
    end_ns: int = 0


@dataclass
class Turn:
    """One model turn as played. `request` holds only the messages added since the previous turn's reply (the
    first turn: the whole opening), so a transcript costs its conversation once, not once per turn."""

    request: list[dict[str, Any]]
    reply: dict[str, Any]  # the assistant message as returned: content, reasoning, tool_calls
    finish_reason: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    invalid: str = ""  # why the reply itself was refused (a tool call the endpoint could not parse)
    start_ns: int = 0  # wall clock (time.time_ns) around the model's reply, for the trace's timeline
    end_ns: int = 0


@dataclass
class Rollout:
    """One trainable sample's record: the role's session, its scores and reward, its counts, its failure."""

    role: str = "agent"  # "agent" (tool_calling); solver/rewriter/selector; thinker/verifier; proposer/solver
    base_url: str = ""  # the chat session whose recorded tokens form the sample
    scores: dict[str, float] | None = None  # the env's named scores; None: nothing was scored (an early exit)
    env_reward: float | None = None  # the env's own reward for the episode
    score: float = 0.0  # the episode's score: the reward group's step 1, unweighted (0 when flagged or unscored)
    reward: float = 0.0  # the trained reward: score x weight (0 when flagged)
    weight: float = 1.0  # the reward group's factor for a judged play's outcome (asymmetric weighting)
    rubric: dict[str, float] = field(default_factory=dict)  # reward=rubric: each named part's value, for metrics
    failure: Failure | None = None
    error: str = ""
    turns: int = 0  # model turns
    tool_calls: int = 0  # valid tool calls made
    invalid_calls: int = 0  # tool calls answered as invalid (bad JSON, unparsed blocks)
    completion_tokens: int = 0
    context_tokens: int = 0  # the conversation's tokens as the endpoint last counted them
    answer: str = ""
    early_exit: bool = False  # the pattern ended before its outcome (no answer, no accept, invalid variant)
    judged: bool = False  # one of a judged play's rollouts (co-evolution): weighted, and evaluated, by its outcome
    holds_outcome: bool = False  # its answer is its judged play's outcome (co-evolution's selector)
    play_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    frozen: bool = False  # played, never trained
    model: str | None = None  # the role's own model, when it has one
    details: dict[str, Any] = field(default_factory=dict)  # pattern-specific facts, for traces (selected, label)
    transcript: list[Turn] = field(default_factory=list)  # the model turns as played (episode traces)
    # Set by the built-in trainer's runner:
    group: tuple[Any, ...] = ()  # GRPO normalizes advantages within it: (split, index, role group)
    policy: str = "main"  # the model that played it, and the only one its sample may update
    sample: Any = None  # agentrl.inference.sessions.samples.Sample: token ids, loss mask, rollout logprobs
    row: dict[str, Any] = field(default_factory=dict)

    def flag(self, failure: Failure, error: str) -> None:
        """Flag the rollout (the first failure wins: later ones are its consequences)."""
        if self.failure is None:
            self.failure, self.error = Failure(failure), error[:1000]

    @property
    def grade(self) -> float:
        """The environment's own grade of the episode, whatever the reward group makes of it: its reward (else its
        one score, else the mean of its scores); 0 when it scored nothing or the play failed before it was graded.
        Under reward=env_score it equals `score`; under reward=rubric `score` is the rubric's total."""
        if self.failure is not None and self.failure not in REWARD_FAILURES:
            return 0.0
        if self.env_reward is not None:
            return float(self.env_reward)
        if not self.scores:
            return 0.0
        return sum(float(v) for v in self.scores.values()) / len(self.scores)

    @property
    def model_tokens(self) -> int:
        return int(sum(self.sample.loss_mask)) if self.sample is not None else 0


@dataclass
class Play:
    """The rollouts one play of a row produced, and its joint outcome when the pattern has one.

    `judged` patterns (co-evolution) end in one chosen answer: `outcome` holds its scores, None when the play
    exited early, and the rollout that chose it `holds_outcome`. The reward group may weight every rollout of
    the play by that outcome, and marks each `judged` (the record that outlives the `Play`).
    """

    rollouts: list[Rollout]
    outcome: dict[str, float] | None = None
    judged: bool = False


FAILURE_KEY = "agentenv_failure"  # a Miles sample's failure kind (`Failure.value`), set only when flagged
ERROR_KEY = "agentenv_error"  # its detail


def metadata_failure(metadata: Mapping[str, Any]) -> str | None:
    """The failure a Miles sample's metadata names (`FAILURE_KEY`), with its detail; None for an unflagged one."""
    failure = metadata.get(FAILURE_KEY)
    return f"{failure}: {metadata.get(ERROR_KEY) or 'no detail'}" if failure else None


def miles_metadata(rollout: Rollout) -> dict[str, Any]:
    """The dict Miles merges into its sample's metadata (the AgentEnv guide's key names)."""
    out: dict[str, Any] = {
        "reward": 0.0 if rollout.failure else float(rollout.reward),
        "agentenv_scores": dict(rollout.scores or {}),
        "agentenv_tool_calls": rollout.tool_calls,
        "agentenv_invalid_calls": rollout.invalid_calls,
        "agentenv_turns": rollout.turns,
        "agentenv_completion_tokens": rollout.completion_tokens,
        "agentenv_context_tokens": rollout.context_tokens,
        "agentenv_answer": rollout.answer,
    }
    if rollout.failure:
        out[FAILURE_KEY] = rollout.failure.value
        out[ERROR_KEY] = rollout.error
    return out


def miles_rollout(metadata: Mapping[str, Any]) -> Rollout:
    """The record a Miles sample's metadata carries (`miles_metadata` read back): its scores (None when it has
    none), counts, answer and failure."""
    scores = metadata.get("agentenv_scores")
    rollout = Rollout(scores=None if scores is None else dict(scores),
                      answer=str(metadata.get("agentenv_answer") or ""),
                      tool_calls=int(metadata.get("agentenv_tool_calls") or 0),
                      invalid_calls=int(metadata.get("agentenv_invalid_calls") or 0),
                      turns=int(metadata.get("agentenv_turns") or 0),
                      completion_tokens=int(metadata.get("agentenv_completion_tokens") or 0),
                      context_tokens=int(metadata.get("agentenv_context_tokens") or 0))
    if failure := metadata.get(FAILURE_KEY):
        rollout.flag(Failure.of(str(failure)), str(metadata.get(ERROR_KEY) or ""))
    return rollout


def miles_rubric_metadata(rollout: Rollout, reward: float) -> dict[str, Any]:
    """What Miles' rubric hook merges into a sample's metadata after scoring `rollout`: the `reward`, each rubric
    part (`agentenv_rubric`) and, when the rubric failed (its judge gave no score), the failure."""
    out: dict[str, Any] = {"reward": reward, "agentenv_rubric": dict(rollout.rubric)}
    if rollout.failure is not None:
        out[FAILURE_KEY], out[ERROR_KEY] = rollout.failure.value, rollout.error
    return out
