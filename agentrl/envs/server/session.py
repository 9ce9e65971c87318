"""One WebSocket session: at most one live episode at a time, played through the sandbox."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.sandbox.base import EpisodeHandle, Sandbox, SandboxError
from agentrl.envs.server import wire
from agentrl.envs.task import Bundle, Turn

log = logging.getLogger(__name__)

RewardFn = Callable[[dict[str, float]], float | None]


@dataclass
class Served:
    """What every session of one server shares."""

    bundle: Bundle
    sandbox: Sandbox
    reward: RewardFn
    tool_timeout: float
    reset_timeout: float
    # split -> list of (bundle split, bundle index); `all` is every split's tasks in split order.
    splits: dict[str, int]
    order: list[str]
    sessions: set[Session] = field(default_factory=set)

    def locate(self, split: str, index: int) -> tuple[str, int]:
        """The bundle split and index behind the served (split, index); ValueError when there is none."""
        if split not in self.splits:
            raise ValueError(f"there is no split {wire.clip(split)!r}; the splits are {', '.join(self.splits)}")
        n = self.splits[split]
        if not 0 <= index < n:
            raise ValueError(f"split {split!r} has {n} tasks, so it has no task {index}")
        if split != "all":
            return split, index
        for name in self.order:
            if index < self.splits[name]:
                return name, index
            index -= self.splits[name]
        raise AssertionError("unreachable: index checked against the total")


def make_reward(reward: None | str | Callable[[dict[str, float]], float]) -> RewardFn:
    """The function that turns an episode's named scores into the reward sent with `done`."""
    if reward is None:

        def one_score(scores: dict[str, float]) -> float | None:
            if not scores:
                return None
            if len(scores) > 1:
                raise ValueError(f"the episode has {len(scores)} scores ({', '.join(scores)}); pick one: reward=NAME")
            return float(next(iter(scores.values())))

        return one_score
    if isinstance(reward, str):
        name = reward

        def named(scores: dict[str, float]) -> float | None:
            if not scores:
                return None
            if name not in scores:
                raise KeyError(f"no score {name!r}; the episode scored {', '.join(scores)}")
            return float(scores[name])

        return named
    if callable(reward):
        return lambda scores: None if (r := reward(scores)) is None else float(r)
    raise TypeError(f"reward must be None, a score name or a callable, not {type(reward).__name__}")


class Session:
    """The state of one `/ws` connection and the replies to its messages (each an envelope dict)."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.handle: EpisodeHandle | None = None
        self.turn: Turn | None = None
        self.tools: list[dict[str, Any]] = []
        self.tool_names: frozenset[str] = frozenset()
        self.task: dict[str, Any] | None = None
        self.episode_id: str | None = None
        self.step_count = 0
        self.turns = 0
        self.done = False
        self.stop_reason = "the episode has ended; call reset"
        self._teardown: asyncio.Task | None = None

    # -- episode lifecycle ---------------------------------------------------------------------------

    def _end_episode(self) -> None:
        """Mark the episode over and tear it down in the background (awaited before the next reset)."""
        self.done = True
        handle, self.handle = self.handle, None
        self.turn, self.tools, self.tool_names = None, [], frozenset()
        if handle is not None:
            prev = self._teardown

            async def teardown() -> None:
                if prev is not None:
                    await prev
                await handle.close()

            self._teardown = asyncio.ensure_future(teardown())

    async def close(self) -> None:
        """End the live episode and wait until it is torn down."""
        self._end_episode()
        if self._teardown is not None:
            await asyncio.shield(self._teardown)

    def _open_turn(self, turn: Turn) -> None:
        tools = [wire.mcp_tool(t) for t in turn.tools]
        clash = sorted(t["name"] for t in tools if t["name"] in wire.RESERVED_TOOL_NAMES)
        if clash:
            raise ValueError(f"the episode offers tools OpenEnv reserves: {', '.join(clash)}")
        self.turn = turn
        self.tools = [*tools, wire.END_TURN_TOOL]
        self.tool_names = frozenset(t["name"] for t in tools)
        self.turns += 1

    def _error_meta(self, message: str, failure: str | None = None, **extra: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {"status": "error", "error": message, "task": self.task}
        if failure:
            meta["failure"] = failure
        meta.update(extra)
        return meta

    # -- messages -------------------------------------------------------------------------------------

    async def reset(self, data: wire.ResetData) -> dict[str, Any]:
        await self.close()
        self.task, self.episode_id, self.step_count, self.turns = None, None, 0, 0
        self.done = True  # until the episode is deployed
        served = self.served
        split, index = data.split, data.index
        if (split is None) != (index is None):
            msg = "split and index go together: give both, or neither for the first task served"
            return wire.envelope({}, done=True, metadata=self._error_meta(msg))
        if split is None:
            split, index = "all", 0
        assert index is not None
        try:
            source_split, source_index = served.locate(split, index)
            info = served.bundle.task_info(source_split, source_index)
        except (ValueError, IndexError, KeyError) as exc:
            msg = exc.args[0] if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            # The splits travel as data too, so a client learns them without parsing the message.
            return wire.envelope({}, done=True, metadata=self._error_meta(str(msg), splits=dict(served.splits)))
        self.task = {"id": info.task_id, "split": split, "index": index, "toolset": info.toolset}
        self.episode_id = uuid.uuid4().hex
        try:
            async with asyncio.timeout(served.reset_timeout):
                self.handle = await served.sandbox.deploy(source_split, source_index)
                turn = await self.handle.first_turn()
            self._open_turn(turn)
        except TimeoutError:
            self._end_episode()
            msg = f"reset failed: deploying the task took longer than {served.reset_timeout:g}s"
            return wire.envelope({}, done=True, metadata=self._error_meta(msg, "reset_timeout"))
        except Exception as exc:
            log.warning("reset of %s/%s failed: %r", split, index, exc)
            self._end_episode()
            msg = f"reset failed: {type(exc).__name__}: {exc}"
            return wire.envelope({}, done=True, metadata=self._error_meta(msg, "reset_failed"))
        self.done = False
        meta = {"prompt": turn.prompt, "system_prompt": turn.system_prompt, "task": self.task}
        return wire.envelope({}, metadata=meta)

    def list_tools(self) -> dict[str, Any]:
        if self.done or self.handle is None:
            return wire.envelope({"tools": []}, done=True, metadata=self._error_meta(self.stop_reason))
        return wire.envelope({"tools": list(self.tools)})

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.done or self.handle is None:
            obs = {"tool_name": wire.clip(name), "result": None, "error": None}  # no tool: echo a bounded name
            return wire.envelope(obs, done=True, metadata=self._error_meta(self.stop_reason))
        if name != wire.END_TURN and name not in self.tool_names:
            offered = ", ".join([*sorted(self.tool_names), wire.END_TURN])
            shown = wire.clip(name)
            err = wire.tool_error(wire.TOOL_NOT_FOUND, f"there is no tool {shown!r}; this turn offers {offered}")
            return wire.envelope({"tool_name": shown, "result": None, "error": err})
        self.step_count += 1
        if name == wire.END_TURN:
            return await self._end_turn(arguments)
        handle = self.handle
        try:
            async with asyncio.timeout(self.served.tool_timeout):
                result = await handle.call_tool(name, arguments)
        except TimeoutError:
            msg = f"the tool call {name!r} took longer than {self.served.tool_timeout:g}s"
            return self._fail(name, wire.TIMEOUT, msg, "tool_timeout")
        except SandboxError as exc:
            return self._fail(name, wire.TRANSPORT, f"SandboxError: {exc}", "sandbox_error")
        except Exception as exc:
            log.exception("tool %r of %s raised", name, self.task)
            return self._fail(name, wire.EXECUTION, f"{type(exc).__name__}: {exc}", "env_error")
        obs: dict[str, Any] = {
            "tool_name": name,
            "result": wire.text_result(result.text, is_error=result.is_error),
            "error": wire.tool_error(wire.EXECUTION, result.text) if result.is_error else None,
        }
        if result.done:
            return await self._finish(obs, handle)
        return wire.envelope(obs)

    async def _end_turn(self, arguments: dict[str, Any]) -> dict[str, Any]:
        response = arguments.get("response", "")
        if response is None:
            response = ""
        if not isinstance(response, str):
            err = wire.tool_error(wire.INVALID_ARGS, "end_turn takes {'response': <string>}")
            return wire.envelope({"tool_name": wire.END_TURN, "result": None, "error": err})
        handle = self.handle
        assert handle is not None
        try:
            async with asyncio.timeout(self.served.tool_timeout):
                turn = await handle.end_turn(response)
            if turn is not None:
                self._open_turn(turn)
        except TimeoutError:
            msg = f"ending the turn took longer than {self.served.tool_timeout:g}s"
            return self._fail(wire.END_TURN, wire.TIMEOUT, msg, "tool_timeout")
        except Exception as exc:
            return self._fail(wire.END_TURN, wire.EXECUTION, f"{type(exc).__name__}: {exc}", "env_error")
        obs: dict[str, Any] = {"tool_name": wire.END_TURN, "result": None, "error": None}
        if turn is None:
            return await self._finish(obs, handle)
        obs["result"] = {"prompt": turn.prompt, "system_prompt": turn.system_prompt}
        meta = {"prompt": turn.prompt, "system_prompt": turn.system_prompt, "task": self.task}
        return wire.envelope(obs, metadata=meta)

    def _fail(self, name: str, error_type: str, message: str, failure: str) -> dict[str, Any]:
        """A call that ended the episode abnormally: done, no reward, flagged."""
        self._end_episode()
        obs = {"tool_name": name, "result": None, "error": wire.tool_error(error_type, message)}
        return wire.envelope(obs, done=True, metadata=self._error_meta(message, failure, scores={}))

    async def _finish(self, obs: dict[str, Any], handle: EpisodeHandle) -> dict[str, Any]:
        """The episode is over: score it, reply with reward and done, tear it down."""
        try:
            scores = {k: float(v) for k, v in (await handle.scores()).items()}
        except Exception as exc:
            self._end_episode()
            meta = self._error_meta(f"no scores: {type(exc).__name__}: {exc}", "env_error", scores={})
            return wire.envelope(obs, done=True, metadata=meta)
        self._end_episode()
        odd = {k: v for k, v in scores.items() if not math.isfinite(v)}
        if odd:  # NaN is not JSON, and no trainer can learn from it: the episode's code failed
            listed = ", ".join(f"{k}={v}" for k, v in odd.items())
            meta = self._error_meta(f"the episode scored {listed}, not a finite number", "env_error", scores={})
            return wire.envelope(obs, done=True, metadata=meta)
        meta: dict[str, Any] = {"scores": scores, "task": self.task}
        try:
            reward = self.served.reward(scores)
            if reward is not None and not math.isfinite(reward):
                raise ValueError(f"the reward is {reward}, not a finite number")
        except Exception as exc:
            reward = None
            meta.update(status="error", error=f"no reward: {type(exc).__name__}: {exc}", failure="reward_error")
        return wire.envelope(obs, reward=reward, done=True, metadata=meta)

    def state(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "task_id": self.task["id"] if self.task else None,
            "split": self.task["split"] if self.task else None,
            "index": self.task["index"] if self.task else None,
            "turn": self.turns,
            "done": self.done,
        }
