"""parse_tool_calls: Qwen3-style <tool_call> blocks in a completion -> OpenAI tool calls."""

from __future__ import annotations

import json

import pytest

from agentrl.models.tool_calls import parse_tool_calls

SCHEDULE = [0, 0, 1, 0, 1, 1, 0, -1, -1, -1, 0, 1, 1, 1, 1, 0, 0, 0, -1, -1, -1, -1, 0, 0]


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_one_call_becomes_an_openai_tool_call():
    text = block(json.dumps({"name": "submit_schedule", "arguments": {"schedule": SCHEDULE}}))
    content, calls, errors = parse_tool_calls(text)
    assert content == "" and errors == []
    assert len(calls) == 1
    call = calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "submit_schedule"
    assert isinstance(call["function"]["arguments"], str)
    assert json.loads(call["function"]["arguments"]) == {"schedule": SCHEDULE}


def test_several_calls_keep_order_and_get_distinct_ids():
    text = "\n".join(block(json.dumps({"name": f"f{i}", "arguments": {"i": i}})) for i in range(3))
    content, calls, errors = parse_tool_calls(text)
    assert content == "" and errors == []
    assert [c["function"]["name"] for c in calls] == ["f0", "f1", "f2"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert len({c["id"] for c in calls}) == 3


def test_malformed_json_stays_in_content_with_an_error():
    bad = block('{"name": "submit_schedule", "arguments": {"schedule": [0, 1,')
    good = block('{"name": "ok", "arguments": {}}')
    content, calls, errors = parse_tool_calls(f"Trying.\n{bad}\n{good}")
    assert [c["function"]["name"] for c in calls] == ["ok"]
    assert len(errors) == 1 and "not valid JSON" in errors[0]
    assert bad in content and content.startswith("Trying.")
    assert "ok" not in content


def test_call_inside_surrounding_text():
    text = 'I will charge at night.\n' + block('{"name": "submit_schedule", "arguments": {"schedule": [1]}}') + \
        "\nDone."
    content, calls, errors = parse_tool_calls(text)
    assert errors == []
    assert content == "I will charge at night.\n\nDone."
    assert json.loads(calls[0]["function"]["arguments"]) == {"schedule": [1]}


def test_arguments_given_as_a_json_string():
    inner = json.dumps({"schedule": SCHEDULE})
    content, calls, errors = parse_tool_calls(block(json.dumps({"name": "submit_schedule", "arguments": inner})))
    assert errors == [] and content == ""
    assert calls[0]["function"]["arguments"] == inner


def test_arguments_text_is_kept_exactly_as_the_model_wrote_it():
    # Re-rendering an assistant turn must reproduce the model's text (token-in/token-out), so no re-dump.
    raw = '{"schedule":[0,1, -1],  "note": "x"}'
    _, calls, _ = parse_tool_calls(block('{"name": "f", "arguments": ' + raw + '}'))
    assert calls[0]["function"]["arguments"] == raw


@pytest.mark.parametrize(("body", "message"), [
    ('{"arguments": {}}', "missing a string 'name'"),
    ('["submit_schedule"]', "expected a JSON object"),
    ('{"name": "f", "arguments": [0, 1]}', "must be a JSON object"),
    ('{"name": "f", "arguments": "[0, 1]"}', "must be a JSON object"),
    ('{"name": "f", "arguments": "{oops"}', "string that is not JSON"),
])
def test_structurally_wrong_calls_are_errors(body, message):
    text = block(body)
    content, calls, errors = parse_tool_calls(text)
    assert calls == []
    assert len(errors) == 1 and message in errors[0]
    assert content == text


def test_unclosed_block_is_an_error_and_left_as_text():
    text = 'Here:\n<tool_call>\n{"name": "f", "arguments": {}}'
    content, calls, errors = parse_tool_calls(text)
    assert calls == [] and content == text
    assert len(errors) == 1 and "never closed" in errors[0]


def test_text_without_calls_is_returned_unchanged():
    text = "  The answer is 42.\n"
    assert parse_tool_calls(text) == (text, [], [])


def test_missing_arguments_mean_no_arguments():
    _, calls, errors = parse_tool_calls(block('{"name": "get_day"}'))
    assert errors == [] and json.loads(calls[0]["function"]["arguments"]) == {}


def test_non_string_input_is_rejected():
    with pytest.raises(TypeError, match="completion text"):
        parse_tool_calls(None)  # type: ignore[arg-type]
