"""Strict JSON (RFC 8259) in both directions: no `NaN`, `Infinity` or `-Infinity`.

Python's `json` reads and writes those three words, and reads a number too large for a float (`1e400`) as an
infinity. None of this is JSON: a peer in another language rejects the whole message, and a tool handed an
infinity misbehaves. The env server, its client and the agent that parses a model's tool arguments read and write
through here instead.
"""

from __future__ import annotations

import json
import math
from typing import Any


class NonFiniteNumberError(ValueError):
    """A JSON text holds NaN or an infinity (or a number that only a float's infinity could hold)."""


def _refuse_constant(word: str) -> Any:
    raise NonFiniteNumberError(f"{word} is not a JSON number (JSON has no NaN or infinities)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteNumberError(f"{text[:40]} is too large for a finite number (it would read as {value})")
    return value


def loads(text: str | bytes) -> Any:
    """`json.loads` that refuses NaN, Infinity, -Infinity and out-of-range numbers (ValueError saying which)."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` that refuses to write NaN or an infinity (ValueError) instead of writing non-JSON."""
    return json.dumps(value, allow_nan=False, **kwargs)


def non_finite_as_text(value: Any) -> Any:
    """`value` with every NaN or infinite float spelled as a string (`"nan"`, `"inf"`): for replies that echo
    a peer's input back, which must stay JSON whatever the input held."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: non_finite_as_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [non_finite_as_text(v) for v in value]
    return value
