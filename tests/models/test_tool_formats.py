"""model.tool_format: each parser reads its model family's tool calls, and malformed calls become errors, never
exceptions (a model writes anything)."""

from __future__ import annotations

import json

import pytest

from agentrl.config.model import TOOL_FORMATS
from agentrl.models.tool_calls import PARSERS, parse_tool_calls, tool_call_parser


def args_of(call: dict) -> dict:
    return json.loads(call["function"]["arguments"])


def test_the_schema_and_the_parsers_name_the_same_formats():
    assert set(TOOL_FORMATS) == set(PARSERS)


def test_an_unknown_format_is_a_config_error_naming_the_key():
    with pytest.raises(ValueError, match=r"model.tool_format='xml': choose one of qwen, hermes, llama3, mistral"):
        tool_call_parser("xml")


@pytest.mark.parametrize("fmt", ["qwen", "hermes"])
def test_tagged_blocks(fmt):
    text = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    content, calls, errors = parse_tool_calls(text, fmt)
    assert (content, errors) == ("Sure.", [])
    assert calls[0]["function"]["name"] == "f" and args_of(calls[0]) == {"x": 1}


def test_llama3_python_tag_and_bare_json_calls():
    for text in ('<|python_tag|>{"name": "f", "parameters": {"x": 1}}', '{"name": "f", "parameters": {"x": 1}}'):
        content, calls, errors = parse_tool_calls(text, "llama3")
        assert (content, errors) == ("", [])
        assert calls[0]["function"]["name"] == "f" and args_of(calls[0]) == {"x": 1}
    # The arguments keep the model's own spelling (a re-rendered turn reproduces its text).
    _, calls, _ = parse_tool_calls('{"name": "f", "parameters": {"x":1}}', "llama3")
    assert calls[0]["function"]["arguments"] == '{"x":1}'
    content, calls, errors = parse_tool_calls('{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"y": 2}}',
                                              "llama3")
    assert [c["function"]["name"] for c in calls] == ["f", "g"] and errors == []
    assert parse_tool_calls("The price is 42.", "llama3") == ("The price is 42.", [], [])


def test_mistral_tool_calls_list():
    text = 'Let me check. [TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]'
    content, calls, errors = parse_tool_calls(text, "mistral")
    assert (content, errors) == ("Let me check.", [])
    assert [c["function"]["name"] for c in calls] == ["f", "g"] and args_of(calls[0]) == {"x": 1}
    # Mistral's chat templates accept only 9-character alphanumeric call ids.
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)
    assert parse_tool_calls("No call.", "mistral") == ("No call.", [], [])


MALFORMED = [
    ("qwen", '<tool_call>\n{"name": "f", "arguments": {"x": 1\n</tool_call>', "not valid JSON"),
    ("qwen", '<tool_call>\n{"name": "f"', "never closed"),
    ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>', "missing a string 'name'"),
    ("llama3", '<|python_tag|>{"name": "f", "parameters": {"x": ', "not valid JSON"),
    ("llama3", "<|python_tag|>print(1)", "not followed by a JSON call"),
    ("llama3", '{"name": "f", "parameters": [1, 2]}', "must be a JSON object"),
    ("llama3", '{"name": "f", "parameters": {}} and then some', "unexpected text after a call"),
    ("llama3", '{"parameters": {}}', "missing a string 'name'"),
    ("mistral", "[TOOL_CALLS] [{'name': 'f'}]", "not valid JSON"),
    ("mistral", "[TOOL_CALLS] []", "empty list"),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": "nope"}]', "string that is not JSON"),
    ("mistral", '[TOOL_CALLS] ["f"]', "expected a JSON object"),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}}] trailing', "unexpected text after the calls"),
]


@pytest.mark.parametrize(("fmt", "text", "why"), MALFORMED)
def test_malformed_calls_stay_text_with_a_clear_error(fmt, text, why):
    content, calls, errors = parse_tool_calls(text, fmt)
    assert calls == []
    assert content == text  # nothing is lost: the agent sees what the model wrote
    assert len(errors) == 1 and why in errors[0] and errors[0].startswith("tool call 1: ")


DEEP = "[" * 5000  # deeper than json's recursion limit
HOSTILE = ["", "{", "[TOOL_CALLS]", "<|python_tag|>", "<tool_call>", "\x00\ud800", "}{" * 50, '{"name": ' * 200,
           "[TOOL_CALLS] " + DEEP, f"<tool_call>{DEEP}</tool_call>", '{"name": "f", "parameters": ' + DEEP]


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
@pytest.mark.parametrize("text", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_hostile_text_never_raises(fmt, text):
    content, calls, errors = parse_tool_calls(text, fmt)
    assert isinstance(content, str) and isinstance(calls, list) and isinstance(errors, list)


def test_a_non_string_is_a_type_error_naming_what_it_got():
    for fmt in TOOL_FORMATS:
        with pytest.raises(TypeError, match="got int"):
            parse_tool_calls(3, fmt)  # type: ignore[arg-type]
