"""Chat templates in the style models ship with: none has `{% generation %}` blocks.

`QWEN3_STYLE` behaves as Qwen3's stock template does where it matters to training: ChatML turns, the tools
listed in the system turn, `<tool_call>` JSON blocks, tool results grouped in one user turn, an empty think
block in the generation prompt when `enable_thinking` is false, and think blocks dropped from assistant turns
before the last real user query (so the whole conversation is not an extension of each of its prefixes).
Written for these tests; no model files are downloaded.
"""

from __future__ import annotations

QWEN3_STYLE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1, found=false) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if not ns.found and message.role == 'user' %}
        {%- set ns.found = true %}{%- set ns.last_query = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' %}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- if (loop.first and content) or not loop.first %}{{- '\n' }}{%- endif %}
            {%- if call.function %}{%- set call = call.function %}{%- endif %}
            {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
            {%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
""".strip()

# Its generation prompt opens an `assistant` turn, but it renders assistant turns as `bot` turns: what the model is
# prompted with never starts the text it would be trained on (no prefix property).
MISMATCHED_PROMPT = r"""
{%- for message in messages %}
    {%- set role = 'bot' if message.role == 'assistant' else message.role %}
    {{- '<|im_start|>' + role + '\n' + (message.content or '') + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()


def save_with_template(source: str, target: str, template: str) -> str:
    """Copy the model folder `source` to `target` with `template` as its tokenizer's chat template."""
    import json
    import shutil
    from pathlib import Path

    shutil.copytree(source, target)
    folder = Path(target)
    (folder / "chat_template.jinja").write_text(template)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "agentrl_tiny.json").unlink(missing_ok=True)  # a plain Hugging Face folder, as a user brings one
    return str(folder)
