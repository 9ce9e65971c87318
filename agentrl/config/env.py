"""Schemas of the `env` group: which bundle, and the server that serves it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from omegaconf import MISSING

from agentrl.config.bundle_options import ArithOptions, GridSimOptions
from agentrl.config.numbers import check_counts, check_finite, check_ports

# The env server's deadlines in seconds: the schema's defaults below, and the defaults of everything that talks to
# an env server without a config (build_app, EpisodeClient, `python -m agentrl.rows`, a row without settings).
TOOL_TIMEOUT_S = 60.0  # one tool call
RESET_TIMEOUT_S = 600.0  # a reset's wait for room on a full or restarting server
CONNECT_TIMEOUT_S = 30.0  # retrying while nothing listens at the URL
# A session opened by `openenv/session/create` (OpenEnv 0.10's /mcp) that no WebSocket holds ends after this
# many idle seconds, so a client that never joins or closes it leaks no slot.
SESSION_IDLE_TIMEOUT_S = 300.0


class AppOptions(TypedDict):
    """The `build_app` keyword arguments `env.server` fixes (`EnvServerConfig.app_options`)."""

    max_concurrent_envs: int
    tool_timeout: float
    reset_timeout: float
    session_idle_timeout: float


@dataclass
class EnvServerConfig:
    # null: start a server for this run on this machine; else the URL of one already running.
    url: str | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    max_concurrent_envs: int = 64
    tool_timeout: float = TOOL_TIMEOUT_S  # seconds
    reset_timeout: float = RESET_TIMEOUT_S  # seconds a reset may wait for room on a full or restarting server
    # Seconds an /mcp-created session nobody holds may sit idle before it expires (frees its slot).
    session_idle_timeout: float = SESSION_IDLE_TIMEOUT_S
    # Seconds a rollout keeps trying while nothing listens at the URL (refused, unknown host, no route)
    # before it is flagged env_unreachable; shorter than reset_timeout so a dead server stops a run fast.
    connect_timeout: float = CONNECT_TIMEOUT_S
    # The *name* of the environment variable that holds the bearer token; the token never enters config.
    token_var: str | None = None
    # Serve the run's env server (url null) from a child process of its own instead of a thread of the trainer's,
    # so its HTTP and tool calls leave the learner's interpreter (agentrl/envs/server/process.py).
    process: bool = False

    def __post_init__(self) -> None:
        check_ports("env.server", self, ("port",))
        check_counts("env.server", self, ("max_concurrent_envs",))
        check_finite("env.server", self, ("tool_timeout", "reset_timeout", "session_idle_timeout", "connect_timeout"),
                     positive=True)
        if self.process and self.url:
            raise ValueError(f"env.server.process=true starts a server for this run, but env.server.url={self.url} "
                             "names one already running: set one of them")

    def app_options(self) -> AppOptions:
        """The `build_app` options these settings fix: the run's env server is built from them, on a thread, in
        a child process, or by Miles' launch (each adds its own token, reward and sandbox)."""
        return {"max_concurrent_envs": self.max_concurrent_envs, "tool_timeout": self.tool_timeout,
                "reset_timeout": self.reset_timeout, "session_idle_timeout": self.session_idle_timeout}


@dataclass
class EnvConfig:
    _target_: str = "agentrl.envs.bundles.load_bundle"
    # A bundle name shipped with agentrl (gridsim, arith, calc) or a path to a bundle folder.
    bundle: str = MISSING
    train_split: str = "train"
    eval_split: str = "eval"
    server: EnvServerConfig = field(default_factory=EnvServerConfig)


@dataclass
class GridSimEnvConfig(GridSimOptions, EnvConfig):
    """GridSim's options (prompt_style, generated_days: `bundle_options.GridSimOptions`, which the bundle reads too)."""

    bundle: str = "gridsim"


@dataclass
class ArithEnvConfig(ArithOptions, EnvConfig):
    """Arith's options (data_file, prompt_key, label_key: `bundle_options.ArithOptions`, which the bundle reads too)."""

    bundle: str = "arith"


@dataclass
class CalcEnvConfig(EnvConfig):
    """Arithmetic through a calculator tool (agentrl/envs/bundles/calc): calculate, then submit_answer."""

    bundle: str = "calc"


@dataclass
class OpenEnvEnvConfig(EnvConfig):
    """An OpenEnv server someone else wrote (OpenEnv's app or any server speaking the protocol)."""

    bundle: str = "openenv"
    url: str | None = None  # the remote server's base URL (http://host:port); required, checked at plan time
    # When url is null: an app to serve here instead, on a free local port for the run's lifetime: an OpenEnv
    # environment folder (its openenv.yaml names the app, e.g. OpenEnv/envs/grid_world_env), or
    # package.module:function returning an ASGI app (e.g. agentrl.envs.bundles.openenv_remote.example:app).
    serve: str | None = None
    # The *name* of the environment variable holding the remote server's bearer token.
    token_var: str | None = None
    # null: discover the MCP tools; a list of names keeps those; a list of tool schemas is used as given.
    tools: list[Any] | None = None
    mode: str = "auto"  # auto | tools (MCP tools) | actions (one tool taking the typed step action)
    action_tool: str = "act"  # the tool's name in actions mode (not step: OpenEnv reserves it)
    tasks: str | None = None  # JSONL of {split, prompt, system_prompt, reset, task_id}; null: seeds
    train_size: int = 64
    eval_size: int = 32
    seed: int = 0  # train resets take seed..seed+train_size-1, eval resets the next eval_size seeds
    seed_key: str = "seed"  # the reset keyword the seed goes in
    prompt: str = ""  # put before the reset observation in every task's prompt (a task's own prompt wins)
    system_prompt: str = "You act in an environment through its tools. Call them until the task is done."
    reward_mode: str = "last"  # last: the env's last reward; sum: the sum of its rewards
    connect_timeout: float = 10.0  # seconds the plan-time probe of env.url may take
    step_timeout: float = 60.0  # seconds one remote reset or step may take
    room_timeout: float = 120.0  # seconds an episode waits while the remote server is at capacity
    # A scripted policy (package.module:function, conversation so far -> next tool call) whose real plays of the
    # remote env are the warm start's demonstrations; its function name is the teacher (trainer.warm_start.teacher).
    teacher: str | None = None

    def __post_init__(self) -> None:
        check_finite("env", self, ("connect_timeout", "step_timeout", "room_timeout"), positive=True)


@dataclass
class ReasoningGymEnvConfig(EnvConfig):
    """Procedural tasks of the reasoning-gym library, graded by its own scorers."""

    bundle: str = "reasoning_gym"
    # dataset name -> its reasoning-gym config (plus optional train_size / eval_size for that dataset), or a list
    # of names (their default configs); null: chain_sum. Untyped so a CLI dict replaces it instead of merging.
    datasets: Any = None
    train_size: int = 256  # tasks per dataset
    eval_size: int = 64
    seed: int = 0  # train and eval draw from different seeds; an eval question in train is skipped
    level: int | None = None  # the curriculum's difficulty level; null: the library's default config
    answer_mode: str = "tool"  # tool (the answer tool) | text (the final reply) | both
    system_prompt: str | None = None  # null: one that asks for the answer the answer_mode way
    # Move the train split one level up when the mean train score of the last `curriculum_window`
    # episodes reaches this; null: no curriculum. Logged as env/level.
    curriculum_threshold: float | None = None
    curriculum_window: int = 64
    max_level: int = 10

    def __post_init__(self) -> None:
        if self.curriculum_threshold is not None:
            check_finite("env", self, ("curriculum_threshold",))


@dataclass
class TextArenaEnvConfig(EnvConfig):
    """Seeded matches of a TextArena game; play them with agent=self_play (one role per seat)."""

    bundle: str = "textarena"
    game: str = "TicTacToe-v0"  # a TextArena env id that runs offline
    num_players: int = 2
    train_size: int = 256  # matches (seeds)
    eval_size: int = 64  # the eval seeds follow the train seeds
    seed: int = 0
    # null: the agent plays every seat (self-play); random | first | heuristic: a scripted opponent takes the other
    # seat (a move listed in the observation's Available Moves; heuristic, TicTacToe only: win, block, centre,
    # corner) and the agent's seat alternates by task index.
    train_opponent: str | None = None
    eval_opponent: str | None = "random"
    # Show only the last N characters of each observation (a small model's context); null: all of it.
    prompt_chars: int | None = None
    # full: TextArena's observation (cut by prompt_chars); board: only the current position (the player's mark,
    # the board without grid lines, the available moves), ~40 tokens a TicTacToe turn for a small model.
    observation: str = "full"
