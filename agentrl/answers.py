"""Find a final answer in model text and check it against a label (1.0 or 0.0): the arith bundle grades with
it, and agents that judge answers themselves (the adversarial pattern) use it too. Standard library only.

Answers may be given as `\\boxed{...}`, `Answer: ...` or `<final_answer>...</final_answer>`; the last one in the
text wins. Numbers compare exactly as fractions, so `1,000`, `1000.0`, `$1000$`, `\\$1{,}000` and `2000/2` all
equal the label `1000`. Non-numeric labels compare as normalised strings.
"""

from __future__ import annotations

import re
from fractions import Fraction

_TAG = re.compile(r"<final_answer>(.*?)</final_answer>", re.S | re.I)
_ANSWER = re.compile(r"\banswer[ \t*_]*[:：][ \t*_]*([^\n]*)", re.I)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"(?<=\d)(?:,|\{,\}|\\,|\\!|\s)(?=\d{3}(?!\d))")


def _boxed_spans(text: str) -> list[tuple[int, str]]:
    """(position, content) of every `\\boxed{...}`, matching nested braces."""
    out = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append((m.start(), text[m.end():i - 1]))
    return out


def _wrapped(s: str) -> bool:
    """True for "{...}" whose first brace closes at the end ("{5}"), not "{1}{2}"."""
    if not (s.startswith("{") and s.endswith("}")):
        return False
    depth = 0
    for i, ch in enumerate(s):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return i == len(s) - 1
    return False


def extract_answer(text: str) -> str | None:
    """The last final answer marked in `text` (boxed, `Answer:` line or final_answer tag), or None."""
    if not isinstance(text, str):
        return None
    found = [(m.start(), m.group(1)) for m in _TAG.finditer(text)]
    found += _boxed_spans(text)
    found += [(m.start(1), m.group(1)) for m in _ANSWER.finditer(text)]
    found = [(pos, s.strip()) for pos, s in found if s.strip()]
    if not found:
        return None
    answer = max(found, key=lambda f: f[0])[1]
    inner = _boxed_spans(answer)  # "Answer: \boxed{5}" -> "5"
    return inner[-1][1].strip() if inner else answer


def normalize(answer: str) -> str:
    """Strip the LaTeX and punctuation that do not change an answer's value."""
    s = answer.strip()
    inner = _boxed_spans(s)
    if inner:
        s = inner[-1][1]
    while _wrapped(s):
        s = s[1:-1].strip()
    s = _TEXT.sub(r"\1", s)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    for junk in ("\\left", "\\right", "\\(", "\\)", "\\[", "\\]", "\\$", "$", "\\%", "%", "\\displaystyle"):
        s = s.replace(junk, "")
    s = _THOUSANDS.sub("", s)
    s = s.strip().rstrip(".").strip()
    if "=" in s:  # "x = 5" -> "5"
        s = s.rsplit("=", 1)[1].strip()
    s = re.sub(r"^\((-?[\d.]+)\)/\((\d+)\)$", r"\1/\2", s)
    return s.replace(" ", "")


def to_number(answer: str) -> Fraction | None:
    """The exact value of a normalised answer that is a single number (integer, decimal or a/b), else None."""
    s = normalize(answer)
    # Allow trailing units written as words ("12 apples" -> 12) but nothing else around the number.
    m = re.fullmatch(r"(" + _NUMBER.pattern + r")([a-zA-Z]*)", s)
    if not m:
        return None
    try:
        return Fraction(m.group(1))
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(answer: str, label: str) -> bool:
    """True when `answer` equals `label` as numbers, or as normalised strings when either is not a number."""
    a, b = to_number(answer), to_number(str(label))
    if a is not None and b is not None:
        return a == b
    return normalize(answer) == normalize(str(label)) != ""


def verify_answer(text: str, label: str) -> float:
    """1.0 if the final answer marked in `text` equals `label`, else 0.0 (also when no answer is marked)."""
    answer = extract_answer(text)
    return 1.0 if answer is not None and answers_match(answer, label) else 0.0
