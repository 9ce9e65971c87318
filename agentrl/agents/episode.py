"""The episode kernel every pattern plays through: one model session plays the row's episode on its env server.

`play_episode` plays up to `max_turns` model turns with the row's tools and returns the typed `Rollout`;
`submit` scores a finished answer without a model. The tool-calling agent (`agentrl.agents.tool_calling`) is
`play_episode` for one session; the other patterns run it per role. Nothing here raises for env or model
failures: the rollout ends flagged (`Rollout.failure`) and scores 0, and the episode is always closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrl.agents.chat import ChatError, ChatReply, chat, estimate_tokens, vary_seed
from agentrl.agents.record import Failure, Rollout, ToolCall, Turn
from agentrl.config.agent import ToolCallingAgentConfig
from agentrl.config.env import EnvServerConfig
from agentrl.envs import strict_json
from agentrl.envs.client import (
    CallResult,
    EnvAuthError,
    EnvClientError,
    EnvConnectionError,
    EnvResetError,
    EnvTimeoutError,
    EnvUnreachableError,
    EpisodeClient,
)
from agentrl.http import async_client

log = logging.getLogger(__name__)

END_TURN = "end_turn"
# A tool-call block left in the reply's text: the endpoint's parser could not read it (SGLang's drops it).
_UNPARSED_CALL = re.compile(r"<tool_call>", re.I)


@dataclass
class _Play:
    """An episode in progress: the conversation, and the record it fills."""

    record: Rollout
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    uncounted: list[dict[str, Any]] = field(default_factory=list)  # messages appended since the last count
    recorded: int = 0  # messages[:recorded] are in the transcript already
    final: CallResult | None = None

    def flag(self, failure: Failure, error: str) -> None:
        self.record.flag(failure, error)


def episode_client(metadata: Mapping[str, Any]) -> EpisodeClient:
    """A client for the row's episode: the env server's URL and settings as the row carries them."""
    server = EnvServerConfig()  # the defaults of a row that does not carry a setting
    return EpisodeClient(str(metadata["url"]), token_var=metadata.get("token_var") or None,
                         reset_timeout=float(metadata.get("reset_timeout") or server.reset_timeout),
                         tool_timeout=float(metadata.get("tool_timeout") or server.tool_timeout),
                         connect_timeout=float(metadata.get("connect_timeout") or server.connect_timeout))


def env_failure(exc: EnvClientError, *, started: bool) -> Failure:
    """The one mapping of an env client error to the play's failure, for every agent pattern. `started`: False for
    the reset that opens the episode, True for a call in it (where a timeout is the tool's, and any other lost
    connection is the env server gone mid-episode). A refused token is `env_auth` either way: a server that
    rotates its token mid-episode is misconfigured, not gone, and its remedy is the same as at reset."""
    if isinstance(exc, EnvAuthError):
        return Failure.ENV_AUTH
    if started:
        if isinstance(exc, EnvTimeoutError):
            return Failure.TOOL_TIMEOUT
        return Failure.ENV_GONE if isinstance(exc, EnvConnectionError) else Failure.ENV_ERROR
    if isinstance(exc, (EnvResetError, EnvTimeoutError)):
        return Failure.DEPLOY
    if isinstance(exc, EnvUnreachableError):
        return Failure.ENV_UNREACHABLE
    return Failure.ENV_GONE if isinstance(exc, EnvConnectionError) else Failure.ENV_ERROR


async def _reset(env: EpisodeClient, metadata: Mapping[str, Any], play: _Play) -> tuple[str, str, list] | None:
    """Start the row's episode: (user prompt, system prompt, tools), or None (flagged) when it cannot start."""
    try:
        return await env.reset(str(metadata["split"]), int(metadata["index"]))
    except EnvClientError as exc:
        failure = env_failure(exc, started=False)
        play.flag(failure, f"{type(exc).__name__}: {exc}" if failure is Failure.ENV_ERROR else str(exc))
    except (KeyError, ValueError, TypeError) as exc:
        play.flag(Failure.ENV_ERROR, f"{type(exc).__name__}: {exc}")
    return None


def _initial_messages(prompt: Any, system_prompt: str, user_prompt: str) -> list[dict[str, Any]]:
    """The conversation to start from: the given prompt (messages or text), else the env's opening turn."""
    if isinstance(prompt, list) and prompt:
        return [dict(m) for m in prompt]
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    text = prompt if isinstance(prompt, str) and prompt else user_prompt
    return [*messages, {"role": "user", "content": text}]


def _parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str]:
    try:
        if isinstance(raw, dict):
            strict_json.dumps(raw)
            return raw, ""
        # Strict: NaN or Infinity would be refused by the env server, ending the episode as an env error.
        value = strict_json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, TypeError) as exc:
        return None, f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    return value, ""


def call_answer(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the rollout's `answer` (what co-evolution shows the next role): end_turn's response, else
    the call as `name {json arguments}`."""
    return str(arguments.get("response") or "") if name == END_TURN else f"{name} {json.dumps(arguments)}"


def played_answer(message: dict[str, Any]) -> str:
    """The `answer` an episode records for this assistant message when it is the episode's last: its last tool
    call's (`call_answer`), else its text."""
    calls = message.get("tool_calls") or []
    if not calls:
        return str(message.get("content") or "")
    fn = calls[-1].get("function") or {}
    arguments, _ = _parse_arguments(fn.get("arguments", "{}"))
    return call_answer(str(fn.get("name") or ""), arguments or {})


def _append(play: _Play, message: dict[str, Any]) -> None:
    play.messages.append(message)
    play.uncounted.append(message)


async def _model_turn(client: httpx.AsyncClient, base_url: str, play: _Play, request_kwargs: dict[str, Any],
                      settings: ToolCallingAgentConfig) -> ChatReply | None:
    """One model turn, or None (flagged) when it cannot run or failed."""
    rec, max_response = play.record, settings.max_response_tokens
    if settings.max_context_tokens is not None:
        context = (rec.context_tokens + estimate_tokens(play.uncounted)) if rec.turns else \
            estimate_tokens(play.messages)
        if context + (max_response or 0) > settings.max_context_tokens:
            play.flag(Failure.OVER_BUDGET, f"the next turn needs about {context} + {max_response or 0} tokens; "
                                           f"the budget is {settings.max_context_tokens}")
            return None
    began = time.time_ns()
    try:
        reply = await chat(client, base_url, play.messages, tools=play.tools,
                           request_kwargs=vary_seed(request_kwargs, "turn", rec.turns), max_tokens=max_response,
                           timeout=settings.model_timeout)
    except ChatError as exc:
        play.flag(Failure(exc.failure), str(exc))
        return None
    rec.turns += 1
    rec.completion_tokens += reply.completion_tokens
    rec.context_tokens = reply.total_tokens
    # The transcript keeps references to the messages, not copies: a turn costs only its own list.
    rec.transcript.append(Turn(request=play.messages[play.recorded:], reply=reply.message,
                               finish_reason=reply.finish_reason, start_ns=began, end_ns=time.time_ns()))
    # Echo the assistant message exactly as returned: the session server checks it on the next request.
    play.messages.append(reply.message)
    play.recorded = len(play.messages)
    play.uncounted = []
    return reply


def _finish(play: _Play, result: CallResult) -> None:
    """The episode ended with `result`: keep its scores, or flag why it has none."""
    play.final = result
    play.record.scores = dict(result.scores)
    play.record.env_reward = result.reward
    if result.failure:
        play.flag(Failure.of(result.failure), result.text)
    elif result.is_error and not result.scores:
        play.flag(Failure.ENV_ERROR, result.text)
    elif result.reward is None and not result.scores:
        play.flag(Failure.NO_REWARD, "the episode ended without a reward or scores")


async def _call(env: EpisodeClient, name: str, arguments: dict[str, Any], play: _Play) -> CallResult | None:
    """A tool call on the episode; None (flagged) when the env failed."""
    try:
        return await env.call(name, arguments)
    except EnvClientError as exc:
        play.flag(env_failure(exc, started=True), str(exc))
    return None


def _unparsed_call(reply: ChatReply) -> str | None:
    """Why a reply announced a tool call that did not arrive: the endpoint's parser dropped a malformed block
    (finish_reason tool_calls, no calls) or left it in the text. None for a reply without that problem."""
    if not reply.tool_calls and reply.finish_reason == "tool_calls":
        return "your reply announced a tool call, but no call could be read from it"
    if _UNPARSED_CALL.search(reply.content):
        return "your reply holds a <tool_call> block that could not be parsed (its JSON is malformed)"
    return None


async def _tool_calls(env: EpisodeClient, play: _Play, reply: ChatReply) -> bool:
    """Run the reply's tool calls in order; False when the episode ended (done or flagged)."""
    rec = play.record
    calls = rec.transcript[-1].calls
    for call in reply.tool_calls:
        fn = call.get("function") or {}
        name = str(fn.get("name") or "")
        arguments, problem = _parse_arguments(fn.get("arguments", "{}"))
        if arguments is None:
            rec.invalid_calls += 1
            calls.append(ToolCall(name, fn.get("arguments"), invalid=problem))
            text = f"error: the arguments of {name!r} are {problem}; call it again with a JSON object"
            _append(play, {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": text})
            continue
        rec.tool_calls += 1
        rec.answer = call_answer(name, arguments)
        calls.append(ToolCall(name, arguments, start_ns=time.time_ns()))
        result = await _call(env, name, arguments, play)
        calls[-1].end_ns = time.time_ns()
        if result is None:
            return False
        calls[-1].answer, calls[-1].scores = result.text, (dict(result.scores) if result.done else None)
        if result.done:
            _finish(play, result)
            return False
        if name == END_TURN:
            play.tools = result.tools or play.tools
        _append(play, {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": result.text})
    return True


async def _play_turns(env: EpisodeClient, client: httpx.AsyncClient, base_url: str, play: _Play,
                      request_kwargs: dict[str, Any], settings: ToolCallingAgentConfig) -> None:
    rec = play.record
    while rec.turns < settings.max_turns:
        reply = await _model_turn(client, base_url, play, request_kwargs, settings)
        if reply is None:
            return
        unparsed = _unparsed_call(reply)
        if reply.finish_reason == "length" and not reply.tool_calls:
            # Cut before it finished: not a final answer to score, nor a call to run.
            play.flag(Failure.TRUNCATED, "the model's reply hit max_response_tokens without a tool call")
            return
        if reply.tool_calls:
            if not await _tool_calls(env, play, reply):
                return
        elif unparsed is None:
            rec.answer = reply.content
            ended = ToolCall(END_TURN, {"response": reply.content}, start_ns=time.time_ns())
            rec.transcript[-1].calls.append(ended)
            result = await _call(env, END_TURN, {"response": reply.content}, play)
            ended.end_ns = time.time_ns()
            if result is not None:
                ended.answer, ended.scores = result.text, (dict(result.scores) if result.done else None)
            if result is None or result.done:
                if result is not None:
                    _finish(play, result)
                return
            # Another turn of a multi-turn task: its prompt arrives as the user's next message.
            play.tools = result.tools or play.tools
            _append(play, {"role": "user", "content": result.prompt or result.text})
        if unparsed is not None:
            # An invalid call, answered like malformed arguments, so the model is told and tries again.
            rec.invalid_calls += 1
            rec.transcript[-1].invalid = unparsed
            _append(play, {"role": "user", "content": f"error: {unparsed}; call the tool again with its "
                                                      "arguments as a JSON object"})
        if reply.finish_reason == "length":
            # A cut-off reply cannot be continued by another call (the sample would not merge).
            play.flag(Failure.TRUNCATED, "the model's reply hit max_response_tokens")
            return
    # Out of model turns with the episode still open: end the turn so the env scores what was done.
    last = next((m.get("content") or "" for m in reversed(play.messages) if m.get("role") == "assistant"), "")
    result = await _call(env, END_TURN, {"response": last}, play)
    if result is not None:
        if result.done:
            _finish(play, result)
        else:
            play.flag(Failure.MAX_TURNS, f"the task wanted another turn after {rec.turns} model turns")


async def play_episode(base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: Mapping[str, Any],
                       settings: ToolCallingAgentConfig, *, role: str = "agent",
                       http_client: httpx.AsyncClient | None = None) -> Rollout:
    """Play the row's episode (`metadata`: split, index, url and the env server's settings) through the chat
    endpoint at `base_url`; returns its record (scores and counts; `failure` set when flagged)."""
    metadata = dict(metadata or {})
    play = _Play(Rollout(role=role, base_url=base_url), messages=[], tools=list(metadata.get("tools") or []))
    if not metadata.get("url"):
        play.flag(Failure.BAD_ROW, "the row's metadata has no env server 'url'")
        return play.record
    env: EpisodeClient | None = None
    client = http_client or async_client()
    try:
        env = episode_client(metadata)
        started = await _reset(env, metadata, play)
        if started is not None:
            user_prompt, system_prompt, env_tools = started
            play.messages = _initial_messages(prompt, system_prompt, user_prompt)
            play.tools = play.tools or env_tools
            await _play_turns(env, client, base_url, play, dict(request_kwargs or {}), settings)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug must not kill the rollout: flag it and say what it was
        log.exception("the episode failed on %s/%s", metadata.get("split"), metadata.get("index"))
        play.flag(Failure.AGENT_ERROR, f"{type(exc).__name__}: {exc}")
    finally:
        if env is not None:
            await env.close()
        if http_client is None:
            await client.aclose()
    return _ended(play)


def _ended(play: _Play) -> Rollout:
    """The record of a closed episode; one that ended without a result is flagged."""
    if play.final is None and play.record.failure is None:
        play.flag(Failure.NO_REWARD, "the episode ended without a result")
    return play.record


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


async def submit(metadata: Mapping[str, Any], response: str, *, answer: str | None = None, role: str = "agent"
                 ) -> Rollout:
    """Score a finished answer on the row's episode without a model: hand `answer` to the task's one tool
    (see `task_tool_call`) when given, then end the turn with `response` if the episode is still open.
    Returns the episode's record (scores, no model turns); never raises for env failures; closes the episode."""
    metadata = dict(metadata or {})
    play = _Play(Rollout(role=role, answer=answer or response), messages=[],
                 tools=list(metadata.get("tools") or []))
    env: EpisodeClient | None = None
    try:
        env = episode_client(metadata)
        started = await _reset(env, metadata, play)
        if started is None:
            return play.record
        call = task_tool_call(play.tools or started[2], answer) if answer is not None else None
        if call is not None:
            play.record.tool_calls += 1
            result = await _call(env, call[0], call[1], play)
            if result is not None and result.done:
                _finish(play, result)
        if play.final is None and play.record.failure is None:
            result = await _call(env, END_TURN, {"response": response}, play)
            if result is not None:
                if result.done:
                    _finish(play, result)
                else:
                    play.flag(Failure.MAX_TURNS, "the task wanted another turn")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug must not kill the rollout
        play.flag(Failure.AGENT_ERROR, f"{type(exc).__name__}: {exc}")
    finally:
        if env is not None:
            await env.close()
    return _ended(play)
