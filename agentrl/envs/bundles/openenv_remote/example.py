"""An OpenEnv server someone else might have written, for trying `env=openenv` (docs/environments.md).

    python -m agentrl.envs.bundles.openenv_remote.example --port 8010

Served by OpenEnv's own app (`create_app` of the `openenv` package, which the `[dev]` extra installs): an `MCPEnvironment`
with one FastMCP tool, `guess`. Each reset (`seed`) hides a number 1..8; the reward is 1 when it is found
within six guesses, else 0. `bisect` is its teacher (`env.teacher=agentrl.envs.bundles.openenv_remote.example:bisect`):
it halves the range the answers so far leave, so it finds any number in at most four guesses.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

LOW, HIGH = 1, 8


def bisect(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The next `guess` of a bisection over what the conversation's guesses and answers leave (a scripted
    teacher: the conversation so far -> the next tool call)."""
    low, high = LOW, HIGH
    calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    guesses = {c["id"]: _arguments(c).get("number") for c in calls}
    for m in messages:
        number = guesses.get(m.get("tool_call_id")) if m.get("role") == "tool" else None
        if number is not None and m["content"] == "higher":
            low = max(low, number + 1)
        elif number is not None and m["content"] == "lower":
            high = min(high, number - 1)
    return {"name": "guess", "arguments": {"number": (low + high) // 2}}


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = call["function"].get("arguments") or {}
    return json.loads(raw) if isinstance(raw, str) else raw


class Prompt(Observation):
    message: str = ""


class GuessEnv(MCPEnvironment):
    """Find the hidden number with `guess`: it answers higher, lower or correct."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("guess")
        self.secret, self.won, self.steps = 1, False, 0

        @mcp.tool
        def guess(number: int) -> str:
            """Guess the hidden number (1..8)."""
            if number == self.secret:
                self.won = True
                return "correct"
            return "higher" if number < self.secret else "lower"

        super().__init__(mcp)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Prompt:
        self.secret, self.won, self.steps = (seed or 0) % 8 + 1, False, 0
        return Prompt(message="Find the hidden number between 1 and 8 with the guess tool.")

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Observation:
        raise ValueError("this env only takes tool calls")

    async def step_async(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Observation:
        obs = await super().step_async(action, timeout_s=timeout_s, **kw)
        if isinstance(action, CallToolAction):
            self.steps += 1
            if self.won or self.steps >= 6:
                obs.done, obs.reward = True, 1.0 if self.won else 0.0
        return obs

    @property
    def state(self) -> State:
        return State(step_count=self.steps)


def app() -> Any:
    """The example's ASGI app: OpenEnv's own server of `GuessEnv` (64 sessions at once); `env.serve` takes it."""
    return create_app(GuessEnv, CallToolAction, CallToolObservation, max_concurrent_envs=64)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m agentrl.envs.bundles.openenv_remote.example")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    args = parser.parse_args(argv)
    uvicorn.run(app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
