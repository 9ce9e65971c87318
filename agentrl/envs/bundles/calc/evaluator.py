"""The calculator behind the `calculate` tool: arithmetic parsed with `ast`, evaluated exactly, never `eval`.

Whatever a model sends (names, calls, `9**9**9`, 10 MB of text, a thousand nested parentheses) gets an error
text in microseconds: the length is capped before parsing, the tree's depth before evaluating, every
intermediate value's size after each operation, and a power's size before it is computed.

Standard library only (episodes run in minimal containers).
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Any

MAX_CHARS = 200  # longer than any expression a problem needs (~30 chars), short enough to parse in microseconds
MAX_DEPTH = 40  # nesting of the expression tree; the recursive walk stays far from Python's recursion limit
MAX_VALUE = 10 ** 30  # |numerator| and denominator of every intermediate value
MAX_EXPONENT = 64
DECIMALS = 10  # a non-integer result is shown rounded to this many decimal places

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}
# What a model may copy from a prompt or write by habit, mapped to Python's operators.
_SPELLINGS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class CalcError(ValueError):
    """An expression the calculator refuses; the message is what the agent reads."""


def calculate(expression: Any) -> str:
    """The value of `expression` as text ("10065", "0.3333333333"); CalcError saying why it is refused."""
    if not isinstance(expression, str):
        raise CalcError(f"expression must be a string such as \"347 * 29\", not {type(expression).__name__}")
    if len(expression) > MAX_CHARS:
        raise CalcError(f"expression too long ({len(expression)} characters; at most {MAX_CHARS})")
    text = _normalize(expression)
    if not text:
        raise CalcError("empty expression; write one such as \"347 * 29\"")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CalcError(f"cannot parse {expression!r}; use numbers, + - * / // % ** and parentheses") from None
    return format_value(_eval(tree.body, 0))


def _normalize(expression: str) -> str:
    text = expression.translate(_SPELLINGS).replace("^", "**").strip()
    text = _THOUSANDS.sub("", text)  # 1,234 is a number, not a tuple
    return text.rstrip("=").strip()


def _eval(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise CalcError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(node, ast.Constant):
        return _number(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        return _checked(_apply(node.op, left, right))
    raise CalcError(f"only numbers and + - * / // % ** are allowed, not {_describe(node)}")


def _number(value: Any) -> Fraction:
    # bool is an int subclass and `True` parses as a Constant; complex, str and bytes literals parse too.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalcError(f"only numbers are allowed, not {value!r}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise CalcError("number too large or not finite")
        return _checked(Fraction(repr(value)))  # the decimal as written: 0.1 is 1/10, not its binary float
    return _checked(Fraction(value))


def _apply(op: ast.operator, left: Fraction, right: Fraction) -> Fraction:
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if isinstance(op, ast.Pow):
        return _power(left, right)
    if right == 0:
        raise CalcError("division by zero")
    if isinstance(op, ast.Div):
        return left / right
    if isinstance(op, ast.FloorDiv):
        return Fraction(left // right)
    return left % right


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalcError("the exponent of ** must be a whole number")
    e = abs(exponent.numerator)
    if e > MAX_EXPONENT:
        raise CalcError(f"exponent too large (at most {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalcError("division by zero")
    # Bound the size before computing: bit_length * e bounds the result's bits, so `9**387420489` is refused
    # unmade, and anything computed has at most twice MAX_VALUE's bits (then checked exactly).
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    if bits * e > 2 * MAX_VALUE.bit_length():
        raise CalcError(f"number too large (at most {len(str(MAX_VALUE)) - 1} digits)")
    return base ** exponent.numerator


def _checked(value: Fraction) -> Fraction:
    if abs(value.numerator) > MAX_VALUE or value.denominator > MAX_VALUE:
        raise CalcError(f"number too large (at most {len(str(MAX_VALUE)) - 1} digits)")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Attribute):
        return "an attribute"
    return type(node).__name__


def format_value(value: Fraction) -> str:
    """An integer as its digits; anything else rounded to DECIMALS places, trailing zeros dropped."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = round(value * 10 ** DECIMALS)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10 ** DECIMALS)
    digits = f"{frac:0{DECIMALS}d}".rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"
