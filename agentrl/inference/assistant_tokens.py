"""Which tokens of a chat the model wrote: the assistant mask SFT trains on, for any chat template.

A template with `{% generation %}` blocks (agentrl's own) marks them itself (transformers'
`return_assistant_tokens_mask`). A stock template (Qwen2.5's, Qwen3's, Llama's: none has such blocks) is read
the way a rollout sees it: the prompt rendered with the generation prompt, each assistant turn as the text its
render adds after that prompt (up to the end-of-turn text), and between turns the token-in/token-out suffix
(`tito.suffix_ids`). Each turn is checked for the prefix property (the conversation up to the turn, with the
generation prompt, starts the render that includes the turn); a template without it cannot be trained on and
`TemplateError` says so. `check_chat_template` runs all of this on a sample tool conversation at plan time.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.inference.sessions import tito
from agentrl.models.tool_calls import PARSERS, tool_call_parser

_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
# The rollouts' template arguments (the trainers' request kwargs): SFT renders with the same ones.
ROLLOUT_TEMPLATE_KWARGS = {"enable_thinking": False}
Encoded = tuple[list[int], list[int]]


class TemplateError(ValueError):
    """The chat template cannot give the tokens a turn needs, or writes tool calls the parser cannot read."""


def has_generation_blocks(template: Any) -> bool:
    """True when the template marks the assistant's tokens itself (`{% generation %}`)."""
    return isinstance(template, str) and bool(_GENERATION_BLOCK.search(template))


def end_of_turn(tokenizer: Any) -> str:
    """The text that ends an assistant turn: ChatML's `<|im_end|>` when the vocabulary has it, else EOS."""
    return "<|im_end|>" if "<|im_end|>" in tokenizer.get_vocab() else str(tokenizer.eos_token)


def encode_assistant_turns(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None,
                           template_kwargs: dict[str, Any] | None = None) -> Encoded:
    """(token ids, assistant mask) of `messages`, cut after the last assistant token.

    Raises TemplateError when the template marks no assistant token or lacks the prefix property.
    """
    if has_generation_blocks(getattr(tokenizer, "chat_template", None)):
        return _generation_mask(tokenizer, messages, tools)
    return _prefix_mask(tokenizer, messages, tools, dict(ROLLOUT_TEMPLATE_KWARGS if template_kwargs is None
                                                         else template_kwargs))


def _generation_mask(tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> Encoded:
    enc = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
    if not any(mask):
        raise TemplateError("the chat template's {% generation %} blocks mark no assistant token")
    end = max(j for j, m in enumerate(mask) if m) + 1
    return ids[:end], mask[:end]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, prompt: bool, kwargs: dict[str, Any]) -> str:
    try:
        return tito.render_text(tokenizer, messages, tools, prompt, kwargs)
    except tito.MessageValidationError as exc:
        raise TemplateError(str(exc)) from exc


def _prefix_mask(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]) -> Encoded:
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise TemplateError("the chat has no assistant turn to train on")
    end_text = end_of_turn(tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    for k, i in enumerate(turns):
        if k == 0:
            between = tito.encode(tokenizer, _render(tokenizer, messages[:i], tools, True, kwargs))
        else:
            prev = turns[k - 1]
            try:
                between = tito.suffix_ids(tokenizer, messages[:prev + 1], messages[prev + 1:i], tools, kwargs,
                                          end_text, ended_with_stop=True)
            except tito.TokenizationError as exc:
                raise TemplateError(str(exc)) from exc
        ids += between
        mask += [0] * len(between)
        turn = tito.encode(tokenizer, _turn_text(tokenizer, messages, i, tools, kwargs, end_text))
        ids += turn
        mask += [1] * len(turn)
    return ids, mask


def _turn_text(tokenizer: Any, messages: list[dict[str, Any]], i: int, tools: Any, kwargs: dict[str, Any],
               end_text: str) -> str:
    """What assistant turn `i` adds after the generation prompt, through its end-of-turn text."""
    prompt = _render(tokenizer, messages[:i], tools, True, kwargs)
    whole = _render(tokenizer, messages[:i + 1], tools, False, kwargs)
    if not whole.startswith(prompt):
        at = next((j for j, (a, b) in enumerate(zip(prompt, whole, strict=False)) if a != b), len(whole))
        raise TemplateError(
            f"the chat template lacks the prefix property at assistant turn {i}: the conversation rendered with "
            f"the generation prompt ({prompt[at:at + 60]!r} at character {at}) does not start the render that "
            f"holds the turn ({whole[at:at + 60]!r}); the model could not be trained on what it is prompted with")
    end = whole.find(end_text, len(prompt))
    if end < 0:
        raise TemplateError(f"the chat template does not close assistant turn {i} with {end_text!r}")
    return whole[len(prompt):end + len(end_text)]


# The plan's sample: a tool call (9-character id: Mistral's templates refuse others), its result, an answer.
_SAMPLE_CALL = {"name": "get_price", "arguments": {"hour": 7}}
_SAMPLE_TOOLS = [{"type": "function", "function": {
    "name": "get_price", "description": "The price at an hour.",
    "parameters": {"type": "object", "properties": {"hour": {"type": "integer"}}, "required": ["hour"]}}}]
_SAMPLE = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "What is the price at hour 7?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_price", "arguments": '{"hour": 7}'}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "42"},
    {"role": "assistant", "content": "The price is 42."},
]


def check_chat_template(tokenizer: Any, tool_format: str) -> str:
    """Check, on a sample tool conversation, that the template gives an assistant mask and writes tool calls
    that `tool_format`'s parser reads back; returns how the mask is computed. TemplateError says what fails
    (for a tool-call mismatch it names the formats that would read the template's calls)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise TemplateError("the tokenizer has no chat template")
    ids, mask = encode_assistant_turns(tokenizer, _SAMPLE, _SAMPLE_TOOLS)
    if not any(mask):
        raise TemplateError("the chat template marks no assistant token")
    first_turn = _first_run(ids, mask)
    text = tokenizer.decode(first_turn, skip_special_tokens=False)
    text = text[:text.rfind(end_of_turn(tokenizer))] if end_of_turn(tokenizer) in text else text
    if not text.strip() or "get_price" not in text:
        # Its assistant turns ignore tool_calls (SmolLM2's stock template renders only role and content).
        raise TemplateError(f"the chat template writes no tool calls: it renders an assistant turn that calls a "
                            f"tool as {text.strip()[:80]!r}, so the model can neither be shown nor trained on a "
                            "call. Give it a template that renders tool calls and tools with model.chat_template="
                            "FILE; for a ChatML model agentrl ships one: model.chat_template="
                            f"{_shipped_template()} with model.tool_format=hermes")
    if not _reads_sample(tool_call_parser(tool_format), text):
        readers = [name for name, parse in PARSERS.items() if _reads_sample(parse, text)]
        hint = f"model.tool_format={readers[0]} reads them" if readers else "no tool format agentrl knows reads them"
        raise TemplateError(f"model.tool_format={tool_format} cannot read the tool calls this chat template "
                            f"writes ({text.strip()[:160]!r}); {hint}")
    if has_generation_blocks(template):
        return "chat template: {% generation %} blocks mark the assistant's tokens"
    return "chat template: no {% generation %} blocks; assistant tokens taken from prefix renders (checked)"


def _shipped_template() -> str:
    """agentrl's ChatML template with hermes tools, as a path a user can pass to model.chat_template."""
    from importlib.resources import files

    return str(files("agentrl.models").joinpath("chatml_tools.jinja"))


def _first_run(ids: list[int], mask: list[int]) -> list[int]:
    start = mask.index(1)
    end = next((j for j in range(start, len(mask)) if not mask[j]), len(mask))
    return ids[start:end]


def _reads_sample(parse: Any, text: str) -> bool:
    import json

    _, calls, errors = parse(text)
    if errors or len(calls) != 1:
        return False
    fn = calls[0]["function"]
    return fn["name"] == _SAMPLE_CALL["name"] and json.loads(fn["arguments"]) == _SAMPLE_CALL["arguments"]
