"""The phrases the inference tests' scripted models emit, each a single token of their tokenizer.

tests/inference/conftest.py adds them to the test tokenizer (`PHRASES`), so a scripted reply built from them has
unique tokens; the tests build their scripts from the same names. They live here, not in the conftest, so a test
imports them by a package path: `from conftest import ...` finds whichever conftest pytest loaded last.
"""

from __future__ import annotations

J_ADD = '\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
CALL_MUL = '\n<tool_call>\n{"name": "mul", "arguments": {"x": 3}}\n</tool_call>'
BAD_JSON = '\n{"name": "add", "arguments": {"a": 1, \n'
PHRASES = [J_ADD, CALL_MUL, BAD_JSON, "Let me compute.\n", "The answer is 3.", " Done."]
