"""The tool-calling agent: one model plays one episode with the row's tools, up to `max_turns` model turns.

`run` is Miles' agent function (`--custom-agent-function-path agentrl.agents.tool_calling.run`) and the same
function the built-in trainer calls through `ToolCallingAgent.play`. It never raises for env or model failures:
the rollout ends flagged (`agentenv_failure`) with reward 0, and the episode is always closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrl.agents.base import PlaySettings, RewardFn, RolloutOutput, SessionPool, new_play_id
from agentrl.agents.chat import ChatError, ChatReply, chat, estimate_tokens
from agentrl.envs.client import (
    CallResult,
    EnvAuthError,
    EnvClientError,
    EnvConnectionError,
    EnvResetError,
    EnvTimeoutError,
    EpisodeClient,
)
from agentrl.http import async_client

log = logging.getLogger(__name__)

END_TURN = "end_turn"
# The env server's failure names that mean the same thing as ours.
_SERVER_FAILURES = {"reward_error": "no_reward", "reset_timeout": "deploy", "reset_failed": "deploy"}


@dataclass
class _Play:
    """What one episode has produced so far."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    turns: int = 0
    tool_calls: int = 0
    invalid_calls: int = 0
    completion_tokens: int = 0
    context_tokens: int = 0  # tokens of the conversation as the endpoint last counted it
    uncounted: list[dict[str, Any]] = field(default_factory=list)  # messages appended since that count
    answer: str = ""
    final: CallResult | None = None
    failure: str | None = None
    error: str = ""

    def flag(self, failure: str, error: str) -> None:
        if self.failure is None:
            self.failure, self.error = failure, error


def _setting(name: str, kw: dict[str, Any], metadata: dict[str, Any], default: Any) -> Any:
    """An agent setting: keyword arguments (the agent config) win over the row's metadata over the default."""
    if kw.get(name) is not None:
        return kw[name]
    if metadata.get(name) is not None:
        return metadata[name]
    return default


def _initial_messages(prompt: Any, system_prompt: str, user_prompt: str) -> list[dict[str, Any]]:
    """The conversation to start from: the given prompt (messages or text), else the env's opening turn."""
    if isinstance(prompt, list) and prompt:
        return [dict(m) for m in prompt]
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    text = prompt if isinstance(prompt, str) and prompt else user_prompt
    return [*messages, {"role": "user", "content": text}]


def _parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str]:
    if isinstance(raw, dict):
        return raw, ""
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    return value, ""


def _append(play: _Play, message: dict[str, Any]) -> None:
    play.messages.append(message)
    play.uncounted.append(message)


async def _model_turn(client: httpx.AsyncClient, base_url: str, play: _Play, request_kwargs: dict[str, Any],
                      max_context: int | None, max_response: int | None, timeout: float) -> ChatReply | None:
    """One model turn, or None (flagged) when it cannot run or failed."""
    if max_context is not None:
        context = (play.context_tokens + estimate_tokens(play.uncounted)) if play.turns else \
            estimate_tokens(play.messages)
        if context + (max_response or 0) > max_context:
            play.flag("over_budget", f"the next turn needs about {context} + {max_response or 0} tokens; "
                                     f"the budget is {max_context}")
            return None
    try:
        reply = await chat(client, base_url, play.messages, tools=play.tools, request_kwargs=request_kwargs,
                           max_tokens=max_response, timeout=timeout)
    except ChatError as exc:
        play.flag(exc.failure, str(exc))
        return None
    play.turns += 1
    play.completion_tokens += reply.completion_tokens
    play.context_tokens = reply.total_tokens
    play.uncounted = []
    # Echo the assistant message exactly as returned: the session server checks it on the next request.
    _append(play, reply.message)
    play.uncounted = []
    return reply


def _finish(play: _Play, result: CallResult) -> None:
    """The episode ended with `result`: keep its scores, or flag why it has none."""
    play.final = result
    if result.failure:
        play.flag(_SERVER_FAILURES.get(result.failure, result.failure), result.text)
    elif result.is_error and not result.scores:
        play.flag("env_error", result.text)


async def _call(env: EpisodeClient, name: str, arguments: dict[str, Any], play: _Play) -> CallResult | None:
    """A tool call on the episode; None (flagged) when the env failed."""
    try:
        return await env.call(name, arguments)
    except EnvTimeoutError as exc:
        play.flag("tool_timeout", str(exc))
    except EnvConnectionError as exc:
        play.flag("env_gone", str(exc))
    except EnvClientError as exc:
        play.flag("env_error", str(exc))
    return None


async def _play_turns(env: EpisodeClient, client: httpx.AsyncClient, base_url: str, play: _Play,
                      request_kwargs: dict[str, Any], settings: dict[str, Any]) -> None:
    while play.turns < settings["max_turns"]:
        reply = await _model_turn(client, base_url, play, request_kwargs, settings["max_context_tokens"],
                                  settings["max_response_tokens"], settings["model_timeout"])
        if reply is None:
            return
        if not reply.tool_calls:
            play.answer = reply.content
            result = await _call(env, END_TURN, {"response": reply.content}, play)
            if result is None or result.done:
                if result is not None:
                    _finish(play, result)
                return
            # Another turn of a multi-turn task: its prompt arrives as the user's next message.
            play.tools = result.tools or play.tools
            _append(play, {"role": "user", "content": result.prompt or result.text})
        else:
            for call in reply.tool_calls:
                fn = call.get("function") or {}
                name = str(fn.get("name") or "")
                arguments, problem = _parse_arguments(fn.get("arguments", "{}"))
                if arguments is None:
                    play.invalid_calls += 1
                    text = f"error: the arguments of {name!r} are {problem}; call it again with a JSON object"
                    _append(play, {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": text})
                    continue
                play.tool_calls += 1
                play.answer = (arguments.get("response") or "") if name == END_TURN else \
                    f"{name} {json.dumps(arguments)}"
                result = await _call(env, name, arguments, play)
                if result is None:
                    return
                if result.done:
                    _finish(play, result)
                    return
                if name == END_TURN:
                    play.tools = result.tools or play.tools
                _append(play, {"role": "tool", "tool_call_id": call.get("id", ""), "name": name,
                               "content": result.text})
        if reply.finish_reason == "length":
            # A cut-off reply cannot be continued by another call (the sample would not merge).
            play.flag("truncated", "the model's reply hit max_response_tokens")
            return
    # Out of model turns with the episode still open: end the turn so the env scores what was done.
    last = next((m.get("content") or "" for m in reversed(play.messages) if m.get("role") == "assistant"), "")
    result = await _call(env, END_TURN, {"response": last}, play)
    if result is not None:
        if result.done:
            _finish(play, result)
        else:
            play.flag("max_turns", f"the task wanted another turn after {play.turns} model turns")


async def run(base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any],
              **kw: Any) -> dict[str, Any]:
    """Play the row's episode through the chat endpoint at `base_url` (Miles' agent function contract).

    `metadata` is the row's: split, index, tools, url, token_var, max_turns, tool_timeout, reset_timeout,
    model_timeout. Keyword settings (`max_turns`, `max_context_tokens`, `max_response_tokens`, `model_timeout`,
    `tool_timeout`, `reset_timeout`) override the row's. `reward_fn(scores) -> float` replaces the env's reward.
    `http_client` reuses an httpx.AsyncClient. Returns `reward` (0 when flagged), `agentenv_scores`,
    `agentenv_tool_calls`, `agentenv_invalid_calls`, `agentenv_turns`, token counts, `agentenv_answer`, and
    `agentenv_failure`/`agentenv_error` when flagged.
    """
    metadata = dict(metadata or {})
    request_kwargs = dict(request_kwargs or {})
    reward_fn: RewardFn | None = kw.get("reward_fn")
    settings = {
        "max_turns": int(_setting("max_turns", kw, metadata, 4)),
        "max_context_tokens": _setting("max_context_tokens", kw, metadata, metadata.get("max_seq_len")),
        "max_response_tokens": _setting("max_response_tokens", kw, metadata, request_kwargs.get("max_tokens")),
        "model_timeout": float(_setting("model_timeout", kw, metadata, 600.0)),
    }
    play = _Play(messages=[], tools=list(metadata.get("tools") or []))
    env: EpisodeClient | None = None
    client = kw.get("http_client")
    own_client = client is None
    if own_client:
        client = async_client()
    try:
        url = metadata.get("url")
        if not url:
            play.flag("bad_row", "the row's metadata has no env server 'url'")
            return _result(play, reward_fn)
        try:
            env = EpisodeClient(url, token_var=metadata.get("token_var") or None,
                                reset_timeout=float(_setting("reset_timeout", kw, metadata, 600.0)),
                                tool_timeout=float(_setting("tool_timeout", kw, metadata, 60.0)))
            user_prompt, system_prompt, env_tools = await env.reset(str(metadata["split"]), int(metadata["index"]))
        except EnvResetError as exc:
            play.flag("deploy", str(exc))
            return _result(play, reward_fn)
        except EnvAuthError as exc:
            play.flag("env_auth", str(exc))
            return _result(play, reward_fn)
        except EnvTimeoutError as exc:
            play.flag("deploy", str(exc))
            return _result(play, reward_fn)
        except EnvConnectionError as exc:
            play.flag("env_gone", str(exc))
            return _result(play, reward_fn)
        except (EnvClientError, KeyError, ValueError, TypeError) as exc:
            play.flag("env_error", f"{type(exc).__name__}: {exc}")
            return _result(play, reward_fn)
        play.messages = _initial_messages(prompt, system_prompt, user_prompt)
        play.tools = play.tools or env_tools
        await _play_turns(env, client, base_url, play, request_kwargs, settings)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug must not kill the rollout: flag it and say what it was
        log.exception("the tool-calling agent failed on %s/%s", metadata.get("split"), metadata.get("index"))
        play.flag("agent_error", f"{type(exc).__name__}: {exc}")
    finally:
        if env is not None:
            await env.close()
        if own_client:
            await client.aclose()
    return _result(play, reward_fn)


def _result(play: _Play, reward_fn: RewardFn | None) -> dict[str, Any]:
    scores = dict(play.final.scores) if play.final is not None else {}
    reward = 0.0
    if play.failure is None:
        if play.final is None:
            play.flag("no_reward", "the episode ended without a result")
        elif reward_fn is not None:
            try:
                reward = float(reward_fn(scores))
            except Exception as exc:  # the reward group's own error says which score is missing
                play.flag("no_reward", f"{type(exc).__name__}: {exc}")
        elif play.final.reward is None:
            play.flag("no_reward", f"the episode ended without a reward (scores {scores})")
        else:
            reward = float(play.final.reward)
    out: dict[str, Any] = {
        "reward": 0.0 if play.failure else reward,
        "agentenv_scores": scores,
        "agentenv_tool_calls": play.tool_calls,
        "agentenv_invalid_calls": play.invalid_calls,
        "agentenv_turns": play.turns,
        "agentenv_completion_tokens": play.completion_tokens,
        "agentenv_context_tokens": play.context_tokens,
        "agentenv_answer": play.answer,
    }
    if play.failure:
        out["agentenv_failure"] = play.failure
        out["agentenv_error"] = play.error[:1000]
    return out


class ToolCallingAgent:
    """`agent=tool_calling`: one session (role "agent") plays the row's episode via `run`."""

    role = "agent"

    def __init__(self, **config: Any) -> None:
        self.settings = PlaySettings.split(config, allowed=())

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, reward_fn: RewardFn,
                   request_kwargs: dict[str, Any]) -> list[RolloutOutput]:
        """Open one session and play the row; the one output's reward is `reward_fn(scores)` (0 when flagged)."""
        base_url = await sessions.open(self.role)
        out = await run(base_url, row.get("messages"), request_kwargs, row.get("metadata") or {},
                        reward_fn=reward_fn, **self.settings.run_kwargs())
        out.update(role=self.role, frozen=False, agentenv_play_id=new_play_id())
        return [RolloutOutput(base_url=base_url, role=self.role, reward=out["reward"], metadata=out)]


def task_tool_call(tools: list[dict[str, Any]], answer: str) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) that hand `answer` to the task's one tool, when the task has exactly one tool besides
    end_turn taking one required argument (arith's submit_answer, GridSim's submit_schedule); else None."""
    task_tools = [t.get("function", t) for t in tools if t.get("function", t).get("name") != END_TURN]
    if len(task_tools) != 1:
        return None
    params = task_tools[0].get("parameters") or {}
    required = params.get("required") or []
    if len(required) != 1:
        return None
    kind = ((params.get("properties") or {}).get(required[0]) or {}).get("type")
    value: Any = answer
    if kind != "string":
        try:
            value = json.loads(answer)
        except ValueError:
            value = answer
        if isinstance(value, dict) and required[0] in value:
            value = value[required[0]]
    return task_tools[0]["name"], {required[0]: value}


async def submit(metadata: dict[str, Any], response: str, *, answer: str | None = None,
                 reward_fn: RewardFn | None = None, **kw: Any) -> dict[str, Any]:
    """Score a finished answer on the row's episode without a model: hand `answer` to the task's one tool
    (see `task_tool_call`) when given, then end the turn with `response` if the episode is still open.
    Returns the same keys as `run` (no model turns); never raises for env failures; closes the episode."""
    metadata = dict(metadata or {})
    play = _Play(messages=[], tools=list(metadata.get("tools") or []), answer=answer or response)
    env: EpisodeClient | None = None
    try:
        env = EpisodeClient(metadata["url"], token_var=metadata.get("token_var") or None,
                            reset_timeout=float(_setting("reset_timeout", kw, metadata, 600.0)),
                            tool_timeout=float(_setting("tool_timeout", kw, metadata, 60.0)))
        try:
            _, _, env_tools = await env.reset(str(metadata["split"]), int(metadata["index"]))
        except EnvResetError as exc:
            play.flag("deploy", str(exc))
            return _result(play, reward_fn)
        except EnvConnectionError as exc:
            play.flag("env_gone", str(exc))
            return _result(play, reward_fn)
        call = task_tool_call(play.tools or env_tools, answer) if answer is not None else None
        if call is not None:
            play.tool_calls += 1
            result = await _call(env, call[0], call[1], play)
            if result is not None and result.done:
                _finish(play, result)
        if play.final is None and play.failure is None:
            result = await _call(env, END_TURN, {"response": response}, play)
            if result is not None:
                if result.done:
                    _finish(play, result)
                else:
                    play.flag("max_turns", "the task wanted another turn")
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        play.flag("agent_error", f"{type(exc).__name__}: {exc}")
    finally:
        if env is not None:
            await env.close()
    return _result(play, reward_fn)
