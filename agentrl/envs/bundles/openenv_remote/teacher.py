"""Demonstrations of a remote OpenEnv env: a scripted policy the user names (`env.teacher=module:callable`)
plays the remote server through the bundle's own episodes, so every demonstration is a real play.

A policy is a callable from the conversation so far (OpenAI chat messages: system, user, then the assistant's
tool calls and the tools' answers) to the next tool call, `{"name": ..., "arguments": {...}}`, or None to end the
turn. It sees only what the agent sees; the transcript is exactly what the tool-calling agent would have sent.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from agentrl.envs.task import Episode

Policy = Callable[[list[dict[str, Any]]], "dict[str, Any] | None"]
MAX_CALLS = 64  # a policy that never ends its turn stops here (the remote env usually ends the episode first)


def load_callable(spec: str, key: str) -> tuple[str, Callable[..., Any]]:
    """(its name, the callable) that `spec`, `package.module:function`, names; ValueError naming `key` if none."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}={spec!r} must name a callable as package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key}={spec!r}: cannot import {module_name} ({exc})") from exc
    found = getattr(module, attr, None)
    if not callable(found):
        raise ValueError(f"{key}={spec!r}: {module_name} has no callable {attr!r}")
    return attr, found


def load_policy(spec: str) -> tuple[str, Policy]:
    """(teacher name, policy) of `env.teacher`: `package.module:callable`; the name is the callable's."""
    return load_callable(spec, "env.teacher")


def play_demonstration(episode: Episode, policy: Policy, label: str) -> tuple[list[dict[str, Any]], float]:
    """(transcript, reward) of `episode` played by `policy`, its tool calls sent to the env as the agent's are;
    the episode is closed after. A call the policy gets wrong raises, naming the task (`label`)."""
    try:
        turn = episode.first_turn()
        messages: list[dict[str, Any]] = [{"role": "system", "content": turn.system_prompt},
                                          {"role": "user", "content": turn.prompt}]
        for n in range(MAX_CALLS):
            if episode.done:
                break
            call = policy([dict(m) for m in messages])
            if call is None:
                episode.end_turn("")
                break
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) \
                    or not isinstance(call.get("arguments", {}), dict):
                raise ValueError(f"the teacher's call on {label} must be {{'name': str, 'arguments': dict}} or "
                                 f"None, not {call!r}")
            name, arguments = call["name"], dict(call.get("arguments") or {})
            result = episode.call_tool(name, arguments)
            call_id = f"call_{n}"
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})
            if result.done:
                break  # the agent's transcript ends at the call that ended the episode (it never reads the answer)
            messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result.text})
        else:
            episode.end_turn("")
        return messages, float(episode.scores().get("reward", 0.0))
    finally:
        close = getattr(episode, "close", None)
        if callable(close):
            close()
