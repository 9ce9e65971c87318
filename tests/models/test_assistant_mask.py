"""The assistant mask SFT trains on, for agentrl's template (`{% generation %}` blocks) and for stock templates
(none): the tokens of each assistant turn as a rollout produces them, and a clear error when a template cannot
give them."""

from __future__ import annotations

import pytest
from stock_templates import MISMATCHED_PROMPT, QWEN3_STYLE

from agentrl.inference.assistant_tokens import (
    TemplateError,
    _prefix_mask,
    check_chat_template,
    encode_assistant_turns,
)
from agentrl.trainers.sft.demonstrations import encode_chat

TOOLS = [{"type": "function", "function": {"name": "submit", "description": "Submit a schedule.",
                                           "parameters": {"type": "object", "properties": {}}}}]
CALL = {"id": "call00001", "type": "function", "function": {"name": "submit", "arguments": '{"schedule": [1, -1]}'}}
CHAT = [{"role": "system", "content": "Plan the battery."}, {"role": "user", "content": "Prices: 3, 9."},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call00001", "content": '{"accepted": false}'},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call00001", "content": '{"accepted": true}'}]
TURN = '<tool_call>\n{"name": "submit", "arguments": {"schedule": [1, -1]}}\n</tool_call><|im_end|>'


@pytest.fixture
def stock(tiny_tokenizer):
    """The tiny tokenizer with a Qwen3-style stock template (restored afterwards: the fixture is shared)."""
    own = tiny_tokenizer.chat_template
    tiny_tokenizer.chat_template = QWEN3_STYLE
    yield tiny_tokenizer
    tiny_tokenizer.chat_template = own


def masked_runs(tokenizer, ids, mask) -> list[str]:
    runs, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tokenizer.decode(cur))
            cur = []
    if cur:
        runs.append(tokenizer.decode(cur))
    return runs


def test_a_stock_template_trains_on_exactly_each_assistant_turn(stock):
    ids, mask = encode_chat(stock, (CHAT, TOOLS), "train/0")  # before: "it needs {% generation %} blocks"
    assert masked_runs(stock, ids, mask) == [TURN, TURN]
    # Cut after the last assistant token: the trailing tool result is not part of the example.
    assert stock.decode(ids).endswith(TURN)


def test_a_stock_template_masks_the_tokens_a_rollout_saw_not_a_re_render(stock):
    ids, _ = encode_assistant_turns(stock, CHAT, TOOLS)
    seen = stock.decode(ids)
    # The first turn was prompted with the empty think block (enable_thinking=false, as the rollouts ask); the
    # template's render of the whole chat drops it from that turn, so re-rendering would train on other tokens.
    assert seen.count("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>") == 2
    whole = stock.apply_chat_template(CHAT[:5], tools=TOOLS, tokenize=False, enable_thinking=False)
    assert whole.count("<think>") == 1


def test_agentrls_template_keeps_its_generation_blocks_and_the_prefix_renders_agree(tiny_tokenizer):
    ids, mask = encode_assistant_turns(tiny_tokenizer, CHAT, TOOLS)
    enc = tiny_tokenizer.apply_chat_template(CHAT, tools=TOOLS, return_dict=True, return_assistant_tokens_mask=True)
    end = len(ids)
    assert (ids, mask) == (list(enc["input_ids"])[:end], list(enc["assistant_masks"])[:end])
    # The other way of reading the same template gives the same assistant text.
    p_ids, p_mask = _prefix_mask(tiny_tokenizer, CHAT, TOOLS, {"enable_thinking": False})
    assert masked_runs(tiny_tokenizer, p_ids, p_mask) == masked_runs(tiny_tokenizer, ids, mask) == [TURN, TURN]


def test_a_template_without_the_prefix_property_is_refused_naming_it(tiny_tokenizer):
    own = tiny_tokenizer.chat_template
    tiny_tokenizer.chat_template = MISMATCHED_PROMPT
    try:
        with pytest.raises(ValueError, match=r"demonstration train/3: the chat template lacks the prefix property "
                                             r"at assistant turn 2"):
            encode_chat(tiny_tokenizer, (CHAT, TOOLS), "train/3")
        with pytest.raises(TemplateError, match="prefix property"):
            check_chat_template(tiny_tokenizer, "qwen")
    finally:
        tiny_tokenizer.chat_template = own


def test_the_check_names_the_tool_format_that_reads_the_templates_calls(stock):
    assert "prefix renders" in check_chat_template(stock, "qwen")
    assert "prefix renders" in check_chat_template(stock, "hermes")  # the same blocks
    with pytest.raises(TemplateError, match=r"model.tool_format=mistral cannot read the tool calls this chat "
                                            r"template writes .*; model.tool_format=qwen reads them"):
        check_chat_template(stock, "mistral")
