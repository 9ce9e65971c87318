"""Every test checks something: a test function in tests/ with no `assert`, no `pytest.raises` / `pytest.warns` /
`pytest.fail`, and no call to a helper named `assert_*`, `check_*` or `expect_*` passes whatever the code does,
so it fails review here, by name. A test that checks through a helper of another name either asserts as well or
names the helper for what it does. Nested functions count as the test's body (a fuzzer's inner property)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PYTEST_CHECKS = {"raises", "warns", "deprecated_call", "fail"}
HELPER_PREFIXES = ("assert_", "check_", "expect_")


def _checks(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id == "pytest" and func.attr in PYTEST_CHECKS:
            return True
        name = func.attr
    elif isinstance(func, ast.Name):
        name = func.id
    else:
        return False
    return name.startswith(HELPER_PREFIXES)


def asserts(test: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether `test`'s body (nested functions included) asserts, expects an exception or warning, fails, or
    calls a checking helper."""
    return any(isinstance(node, ast.Assert) or (isinstance(node, ast.Call) and _checks(node))
               for node in ast.walk(test))


def silent_tests(source: str, where: str) -> list[str]:
    """`where:line name` of each test function in `source` (module-level or in a class) that checks nothing."""
    tree = ast.parse(source)
    tests = [node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name.startswith("Test")):
        tests += [node for node in cls.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    return [f"{where}:{t.lineno} {t.name}" for t in tests if t.name.startswith("test") and not asserts(t)]


def test_every_test_asserts_something() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100, "the test files were not found"
    silent = [hit for path in files
              for hit in silent_tests(path.read_text(), str(path.relative_to(TESTS.parent)))]
    assert not silent, "tests that check nothing (add an assert, or see this file's docstring):\n" + "\n".join(silent)


def test_the_guard_names_a_test_that_checks_nothing() -> None:
    source = '''
import pytest

def helper(x):
    assert x

def test_calls_only_a_helper_of_another_name():
    helper(1)

async def test_awaits_and_checks_nothing():
    await thing()

class TestGrouped:
    def test_in_a_class(self):
        value = 1

def test_asserts():
    assert 1

def test_raises():
    with pytest.raises(ValueError):
        int("x")

def test_fails():
    pytest.fail("never")

def test_checks_through_a_named_helper(page):
    expect_title(page, "x")
    page.assert_called_once()

def test_fuzz():
    def prop(x):
        assert x
    prop(1)
'''
    assert silent_tests(source, "t.py") == [
        "t.py:7 test_calls_only_a_helper_of_another_name", "t.py:10 test_awaits_and_checks_nothing",
        "t.py:14 test_in_a_class"]
