"""Typed request bodies of the session server: every field checked before anything reaches the engine.

One request must never be able to break the engine, so numbers are strict and finite (JSON `NaN`,
`Infinity` and `1e400` are refused), integers are integers (`max_tokens: 1.5` is an error, not 1),
and ranges are those sampling can honour: every integer has an upper bound too (`max_tokens` the
model's context, see `request_model`; ids and `top_k` what an int32 holds), so a huge number is
refused naming its field instead of being clamped. Unknown keys are kept (OpenAI and SGLang clients send
`model`, `logprobs`, `skip_special_tokens`, ...) but may hold only finite numbers and at most
`MAX_DEPTH` levels of nesting, since the body is recorded and sent back by `GET /sessions/{id}`.
A bad body answers 400 `{"error": "<field>: <why>"}` (see `describe`).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from agentrl.inference.sessions.tito import MessageValidationError

MAX_DEPTH = 64  # a tool's JSON schema nests a few levels; a thousand only exhausts recursion downstream
INT32_MAX = 2**31 - 1  # what SGLang and vLLM take for top_k and token ids
MAX_STOP_TOKEN_IDS = 1024

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    # strict: no "0.5" -> 0.5 or 2.0 -> 2 coercion; extra keys are allowed and kept for the record
    model_config = ConfigDict(extra="allow", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; an object is accepted too


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolFunction(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: ToolFunction


class ChatCompletionRequest(_Strict):
    """`POST /sessions/{id}/v1/chat/completions`: OpenAI's chat request plus SGLang's sampling extras."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)  # `request_model` bounds it by the context
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)  # OpenAI's newer name; wins
    temperature: FiniteFloat | None = Field(default=None, ge=0)  # 0 is greedy
    top_p: FiniteFloat | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX)  # 0 or -1 (SGLang's and Miles' "off") disable it
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # what torch.Generator.manual_seed takes
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | None = Field(default=None,
                                                                                  max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None  # sent by Miles; replies keep special tokens either way
    no_stop_trim: bool | None = None  # sent by Miles; the stop token is always in the token ids
    chat_template_kwargs: dict[str, Any] | None = None
    stream: bool | None = None
    n: int | None = None
    stop: str | list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _finite_and_shallow(cls, data: Any) -> Any:
        check_tree(data)
        return data

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("stream=true is not supported by the session server")
        return v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _no_stop_strings(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v:
            raise ValueError("stop strings are not supported; use stop_token_ids")
        return v

    def sampling(self, default_max_tokens: int) -> dict[str, Any]:
        """The engine's `generate` keyword arguments."""
        max_tokens = self.max_completion_tokens or self.max_tokens or default_max_tokens
        return {
            "max_tokens": int(max_tokens),
            "temperature": 1.0 if self.temperature is None else float(self.temperature),
            "top_p": 1.0 if self.top_p is None else float(self.top_p),
            "top_k": max(0, self.top_k or 0),
            "stop_ids": list(self.stop_token_ids) if self.stop_token_ids else None,
            "seed": self.seed,
            "ignore_eos": bool(self.ignore_eos),
        }

    def record(self) -> dict[str, Any]:
        """The body as the client sent it (unset defaults left out), for the session's record."""
        return self.model_dump(exclude_unset=True)


def request_model(max_tokens: int | None) -> type[ChatCompletionRequest]:
    """`ChatCompletionRequest` with `max_tokens` and `max_completion_tokens` at most `max_tokens` (the model's
    context); None leaves them bounded by INT32_MAX only. The bound shows in the OpenAPI schema too."""
    bound = INT32_MAX if max_tokens is None else max(1, int(max_tokens))
    return create_model(  # type: ignore[call-overload]
        "ChatCompletionRequest", __base__=ChatCompletionRequest, __doc__=ChatCompletionRequest.__doc__,
        max_tokens=(int | None, Field(default=None, ge=1, le=bound)),
        max_completion_tokens=(int | None, Field(default=None, ge=1, le=bound)),
    )


class InvalidBody(MessageValidationError):
    """The body is not JSON, or not a valid request (HTTP 400; the message names the field)."""


def parse_request(raw: bytes, model: type[ChatCompletionRequest]) -> ChatCompletionRequest:
    """`raw` parsed and validated as `model`, or InvalidBody. Seconds of work for a body of a million values,
    so the session server runs it on a worker thread, never on its event loop."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise InvalidBody("invalid request: the body nests deeper than the JSON parser allows") from None
    except json.JSONDecodeError as exc:
        raise InvalidBody(f"invalid request: the body is not valid JSON ({exc.msg} at character {exc.pos})") from None
    except ValueError as exc:  # bytes that are no text encoding JSON allows
        raise InvalidBody(f"invalid request: the body is not valid JSON ({exc})") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidBody(f"invalid request: {describe(exc.errors(include_url=False))}") from None


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with its `$defs` substituted in place (for an OpenAPI request body)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def check_tree(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """ValueError naming the path of the first non-finite number or of nesting past `max_depth`.

    Iterative, so a hostile body nested thousands deep cannot exhaust the recursion limit here.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{path or 'body'}: {item} is not a finite number")
        if isinstance(item, dict | list):
            if depth >= max_depth:
                where = path if len(path) <= 80 else path[:80] + "..."
                raise ValueError(f"{where or 'body'}: nested deeper than {max_depth} levels")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, _join(path, k), depth + 1) for k, v in pairs)


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def describe(errors: list[dict[str, Any]] | tuple[dict[str, Any], ...], limit: int = 5) -> str:
    """A one-line message from pydantic / FastAPI validation errors: `field.path: why; ...`."""
    parts = []
    for err in list(errors)[:limit]:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            error = (err.get("ctx") or {}).get("error", "")
            parts.append(f"the body is not valid JSON ({error} at character {loc[0] if loc else '?'})")
            continue
        path = ""
        for p in loc:
            path = _join(path, p)
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        got = err.get("input")
        if err.get("type") not in ("value_error", "missing") and isinstance(got, int | float | str | bool | None):
            msg += f" (got {str(got)[:40]!r})" if isinstance(got, str) else f" (got {got!r})"
        if not path and err.get("type") != "value_error":  # a root type error: the body itself is wrong
            path = "body"
        parts.append(f"{path}: {msg}" if path and not msg.startswith(path) else msg)
    more = len(errors) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
