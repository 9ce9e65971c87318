"""The tiny model's chat template: Qwen3's layout with tools, and prefix-stable rendering for token-in/token-out."""

from __future__ import annotations

import json

import pytest
from jinja2.exceptions import TemplateError

from agentrl.models.corpus import chat_template
from agentrl.models.tool_calls import parse_tool_calls

SCHEDULE_TOOL = {
    "type": "function",
    "function": {
        "name": "submit_schedule",
        "description": "Submit 24 integers.",
        "parameters": {"type": "object", "properties": {"schedule": {"type": "array", "items": {"type": "integer"}}},
                       "required": ["schedule"]},
    },
}
SYSTEM = {"role": "system", "content": "You run a battery."}
USER = {"role": "user", "content": "D=1 eta=90 P=10 | 5 40"}


def render(tokenizer, messages, tools=(SCHEDULE_TOOL,), **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tools=list(tools) or None, tokenize=False, **kwargs)


def call(name: str, arguments, call_id: str = "call_1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tokenizer_carries_the_shipped_template(tiny_tokenizer, tiny_model_dir):
    assert tiny_tokenizer.chat_template == chat_template()
    saved = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert saved["chat_template"] == chat_template()


def test_exact_rendering_of_a_tool_conversation(tiny_tokenizer):
    messages = [SYSTEM, USER,
                {"role": "assistant", "content": "", "tool_calls": [call("submit_schedule", '{"schedule": [1, -1]}')]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"accepted": true}'}]
    tool_json = json.dumps(SCHEDULE_TOOL)
    expected = (
        "<|im_start|>system\nYou run a battery.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tool_json}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nD=1 eta=90 P=10 | 5 40<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        '<tool_call>\n{"name": "submit_schedule", "arguments": {"schedule": [1, -1]}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"accepted": true}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render(tiny_tokenizer, messages, add_generation_prompt=True) == expected


def test_plain_chat_has_no_tools_block(tiny_tokenizer):
    text = render(tiny_tokenizer, [USER], tools=(), add_generation_prompt=True)
    assert text == "<|im_start|>user\nD=1 eta=90 P=10 | 5 40<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    text = render(tiny_tokenizer, [SYSTEM, USER], tools=())
    assert text.startswith("<|im_start|>system\nYou run a battery.<|im_end|>\n<|im_start|>user\n")
    assert "<tools>" not in text and not text.endswith("assistant\n")


def test_tools_without_a_system_message(tiny_tokenizer):
    text = render(tiny_tokenizer, [USER])
    assert text.startswith("<|im_start|>system\n# Tools\n\n")
    assert text.count("<|im_start|>system") == 1


def test_tool_call_variants(tiny_tokenizer):
    # Arguments as a dict or a string, several calls, content before the calls.
    assistant = {"role": "assistant", "content": "Two calls.",
                 "tool_calls": [call("a", {"x": 1}), call("b", '{"y": [2, 3]}', "call_2")]}
    text = render(tiny_tokenizer, [USER, assistant])
    assert text.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nTwo calls.\n"
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"y": [2, 3]}}\n</tool_call><|im_end|>\n')


def test_consecutive_tool_results_share_one_user_turn(tiny_tokenizer):
    messages = [USER, {"role": "assistant", "content": "", "tool_calls": [call("a", {}), call("b", {}, "call_2")]},
                {"role": "tool", "tool_call_id": "call_1", "content": "A"},
                {"role": "tool", "tool_call_id": "call_2", "content": "B"}]
    text = render(tiny_tokenizer, messages)
    assert text.endswith("<|im_start|>user\n<tool_response>\nA\n</tool_response>\n"
                         "<tool_response>\nB\n</tool_response><|im_end|>\n")
    assert text.count("<|im_start|>user") == 2


def test_thinking(tiny_tokenizer):
    on = render(tiny_tokenizer, [USER], add_generation_prompt=True, enable_thinking=True)
    assert on.endswith("<|im_start|>assistant\n")
    off = render(tiny_tokenizer, [USER], add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    history = [USER, {"role": "assistant", "content": "42", "reasoning_content": "six times seven"}, USER]
    assert "<|im_start|>assistant\n<think>\nsix times seven\n</think>\n\n42<|im_end|>\n" in render(tiny_tokenizer, history)
    # A think block left inside the content is split out the same way.
    inline = [USER, {"role": "assistant", "content": "<think>\nsix times seven\n</think>\n\n42"}, USER]
    assert render(tiny_tokenizer, inline) == render(tiny_tokenizer, history)


def test_unknown_role_is_an_error(tiny_tokenizer):
    with pytest.raises(TemplateError, match="unknown message role: robot"):
        render(tiny_tokenizer, [{"role": "robot", "content": "x"}])


def test_assistant_mask_covers_exactly_what_the_model_generates(tiny_tokenizer):
    messages = [SYSTEM, USER, {"role": "assistant", "content": "", "tool_calls": [call("a", {"x": 1})]}]
    out = tiny_tokenizer.apply_chat_template(messages, tools=[SCHEDULE_TOOL], return_dict=True,
                                             return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    generated = tiny_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert generated == '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call><|im_end|>'


def three_turns() -> tuple[list[dict], list[str]]:
    """A 3-turn tool conversation and the raw text the model generated for each assistant turn."""
    outputs = [
        '<tool_call>\n{"name": "submit_schedule", "arguments": {"schedule": [-1, 1]}}\n</tool_call>',
        'Fixing it.\n<tool_call>\n{"name": "submit_schedule", "arguments": {"schedule":[1,-1]}}\n</tool_call>',
        "The schedule was accepted.",
    ]
    results = ['{"accepted": false, "problems": ["HE01: sell, but the battery is empty"]}', '{"accepted": true}']
    messages = [SYSTEM, USER]
    for i, out in enumerate(outputs):
        content, calls, errors = parse_tool_calls(out)
        assert errors == []
        messages.append({"role": "assistant", "content": content, "tool_calls": calls or None})
        if i < len(results):
            messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": results[i]})
    return messages, outputs


def test_prefix_property_across_three_turns_with_tool_results(tiny_tokenizer):
    """render(prefix, add_generation_prompt) + what the model generated + <|im_end|> starts the render of the
    whole conversation, at every assistant turn; so does every prefix that ends with an assistant turn."""
    messages, outputs = three_turns()
    full = render(tiny_tokenizer, messages)
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(assistant_at) == 3
    for k, out in zip(assistant_at, outputs, strict=True):
        prompt = render(tiny_tokenizer, messages[:k], add_generation_prompt=True)
        assert full.startswith(prompt + out + "<|im_end|>"), k
        assert full.startswith(render(tiny_tokenizer, messages[:k + 1]))
        # The same holds for token ids: the prompt's ids are the start of the whole conversation's ids.
        prompt_ids = tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full_ids = tiny_tokenizer(full, add_special_tokens=False)["input_ids"]
        assert full_ids[:len(prompt_ids)] == prompt_ids
