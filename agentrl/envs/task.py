"""The task interface every bundle implements: the env server, SFT data builder and tests all use it.

An episode is plain state (no threads, no globals) so thousands can be created cheaply. The server
calls it from a worker thread; an episode is never called from two threads at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """What the agent sees when a turn opens: prompts and the tools it may call this turn."""

    prompt: str
    system_prompt: str
    # OpenAI function schemas: {"type": "function", "function": {"name", "description", "parameters"}}.
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ToolResult:
    """A tool's answer. `text` is what the agent reads; `done` says the call ended the episode."""

    text: str
    is_error: bool = False
    done: bool = False


@dataclass
class TaskInfo:
    """Public facts about a task (never its references)."""

    task_id: str
    split: str
    index: int
    toolset: str = "default"
    extra: dict[str, Any] = field(default_factory=dict)


class Episode(ABC):
    """One play of one task. One that holds something (a remote session, a process) also defines `close()`,
    which the sandbox and `opening_turn` call when done with it (safe to call twice)."""

    info: TaskInfo

    @abstractmethod
    def first_turn(self) -> Turn:
        """The opening turn: system prompt, first user prompt, tools."""

    @abstractmethod
    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Answer a tool call. Malformed arguments are answered (is_error=True), never raised."""

    @abstractmethod
    def end_turn(self, response: str) -> Turn | None:
        """The agent ended its turn with `response`: the next turn, or None when the episode is over."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True once the episode is over (graded, out of submissions, or ended)."""

    @abstractmethod
    def scores(self) -> dict[str, float]:
        """Named scores of the episode so far, e.g. {"grade": 0.73}; {} when nothing was scored."""


class WrappedEpisode(Episode):
    """Another bundle's episode played as it is: a subclass changes only what it wraps (its facts, a fault)."""

    def __init__(self, inner: Episode) -> None:
        self.inner, self.info = inner, inner.info

    def first_turn(self) -> Turn:
        return self.inner.first_turn()

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return self.inner.call_tool(name, arguments)

    def end_turn(self, response: str) -> Turn | None:
        return self.inner.end_turn(response)

    @property
    def done(self) -> bool:
        return self.inner.done

    def scores(self) -> dict[str, float]:
        return self.inner.scores()

    def close(self) -> None:
        close = getattr(self.inner, "close", None)  # only an episode that holds something defines it
        if callable(close):
            close()


def opening_turn(bundle: Bundle, split: str, index: int) -> Turn:
    """Task `index` of `split`'s opening turn, from an episode closed at once: reading a prompt holds nothing
    open (a remote OpenEnv episode is a server session, and a server holds only so many)."""
    episode = bundle.episode(split, index)
    try:
        return episode.first_turn()
    finally:
        close = getattr(episode, "close", None)  # optional: only episodes that hold something define it
        if callable(close):
            close()


class Bundle(ABC):
    """A set of tasks in named splits. `all` is every task, in split order."""

    name: str
    version: str
    # True when every episode method is pure computation of microseconds (GridSim, arith): the local
    # sandbox then calls them on the event loop, since a worker-thread hop costs more than such a call.
    # Leave False for anything that can block (I/O, subprocesses, sleeps): those run on worker threads.
    inline_episodes: bool = False
    # The teachers `demonstration` can play (GridSim: optimal, greedy). An SFT run or warm start must name one
    # of them; empty: the bundle has no demonstrations.
    teachers: tuple[str, ...] = ()
    # How the eval reward is also broken down: a public task fact (a `TaskInfo.extra` key) -> the metric name
    # its values are averaged under, `{}` standing for the value. GridSim: {"duration_h": "reward_{}h"} gives
    # eval/reward_1h, eval/reward_2h, eval/reward_4h. Empty: the mean only.
    eval_breakdown: dict[str, str] = {}
    # The task fact (a `TaskInfo.extra` key) an eval of N tasks is stratified over, so that N of a split keep the
    # split's shares of each kind (`play/eval_subset.py`); GridSim: "duration_h". None: N spread evenly over
    # the split's indices.
    eval_strata: str | None = None
    # The same for the train reward (`train/<name>`, each rollout's trained reward): env=mix breaks it down by the
    # group a row came from, {"bundle": "reward/{}"} -> train/reward/<group>. Empty: the mean only.
    train_breakdown: dict[str, str] = {}
    # The named scores its episodes report (GridSim: grade): reward=rubric's `Score` parts are checked against them
    # at plan time. Empty: not declared, not checked.
    score_names: tuple[str, ...] = ()

    @abstractmethod
    def splits(self) -> dict[str, int]:
        """Split name -> number of tasks (without `all`, which the server adds)."""

    @abstractmethod
    def task_info(self, split: str, index: int) -> TaskInfo:
        """Public facts about a task; IndexError/KeyError for a bad index/split."""

    @abstractmethod
    def episode(self, split: str, index: int) -> Episode:
        """Start an episode of task `index` of `split`."""

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """Keyword arguments for `agentrl.envs.bundles.load_bundle` that rebuild this bundle elsewhere
        (e.g. inside a Docker sandbox): {"bundle": <name or absolute folder>, **options}. JSON-safe."""

    def data_options(self) -> dict[str, Any]:
        """The options that change this bundle's data (prompts, demonstrations), by name: part of the key of
        anything made from that data and cached (the SFT warm start). {} when no option does."""
        return {}

    def data_source(self) -> str:
        """Where the bundle's rows come from, as the run's MLflow dataset inputs name it: its name (a folder
        bundle: its folder)."""
        return self.name

    def metrics(self) -> dict[str, float]:
        """Metrics of the bundle's own state the trainer logs each step beside its own (reasoning_gym's
        curriculum: `env/level`). {} when there are none."""
        return {}

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        """A chat transcript of the task played by `teacher` (one of `teachers`), for SFT. Optional."""
        raise NotImplementedError(f"bundle {self.name!r} has no demonstrations")

    def demonstration_variant(self, split: str, index: int, teacher: str, rng: Any) -> list[dict[str, Any]]:
        """A variant of task `index` (drawn with `rng`, a `random.Random`) played by `teacher`: extra SFT data
        (`trainer.augment`) from the split's own tasks. Optional."""
        raise NotImplementedError(f"bundle {self.name!r} has no demonstration variants (set trainer.augment=0)")

    def generated_demonstration(self, index: int, teacher: str, seed: int) -> list[dict[str, Any]]:
        """Task `index` of a stream the bundle generates beyond its stored splits (keyed by `seed`, never an eval
        task) played by `teacher`: extra SFT data (`trainer.generated`). Optional."""
        raise NotImplementedError(f"bundle {self.name!r} generates no extra tasks (set trainer.generated=0)")
