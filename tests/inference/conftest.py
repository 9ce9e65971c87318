"""Tiny local models for the inference tests: nothing is downloaded.

* `random_model`: a random Qwen3ForCausalLM (for logprob, batching, weight-update and mask tests).
* `scripted_model(script)`: a Qwen3ForCausalLM whose weights make it a deterministic bigram chain, so
  it always answers with the exact `script` text (tool calls, malformed JSON, text around calls).
  Its layers add nothing to the residual stream, so the last token alone picks the next one.

Both use a byte-level tokenizer with ChatML special tokens and the chat template below.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# Whole phrases the scripted models emit as single tokens, so every script token is unique.
from agentrl.testing.scripted_phrases import PHRASES

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>", "<think>", "</think>"]

# ChatML with tools, in the Qwen3 layout; every rendered prefix is the start of the rendered whole.
CHAT_TEMPLATE = r"""
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
{{- '# Tools\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and message.role == 'system' -%}
{%- elif message.role == 'user' or message.role == 'system' -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}{%- if message.content -%}{{- message.content -}}{%- endif -%}
{%- for call in message.tool_calls or [] -%}
{%- if not loop.first or message.content -%}{{- '\n' -}}{%- endif -%}
{%- if call.function -%}{%- set call = call.function -%}{%- endif -%}
{{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


def build_tokenizer(folder: Path):
    """A byte-level tokenizer (no merges) with ChatML specials, script phrases and CHAT_TEMPLATE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    fast.add_tokens(PHRASES)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def _config(vocab: int, hidden: int, layers: int, head_dim: int = 16):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=1024,
        tie_word_embeddings=False, eos_token_id=None, pad_token_id=None, bos_token_id=None,
    )


def make_random_model(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer Qwen3 with the test tokenizer, saved to `folder`."""
    from transformers import Qwen3ForCausalLM

    tok = build_tokenizer(folder)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_config(len(tok), 64, 2))
    with torch.no_grad():  # a peakier distribution than the 0.02 init, so logprobs vary visibly
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(folder)
    return folder


def make_scripted_model(folder: Path, script: tuple[str, ...], head_dim: int = 16) -> Path:
    """A Qwen3 whose sampled reply after '<|im_start|>assistant\\n' is `"".join(script)` then <|im_end|>.

    Each piece of `script` that is a whole token of the tokenizer (a special token or a phrase) is
    emitted as that one token, so a phrase may hold text such as '<tool_call>' that encoding would split.
    `head_dim` 32 suits vLLM's CPU attention (it has no 16).
    """
    from transformers import Qwen3ForCausalLM

    tok = build_tokenizer(folder)
    added = tok.get_added_vocab()
    chain = tok.encode("\n", add_special_tokens=False)
    for piece in script:
        chain += [added[piece]] if piece in added else tok.encode(piece, add_special_tokens=False)
    chain.append(added["<|im_end|>"])
    nexts = dict(zip(chain[:-1], chain[1:], strict=True))
    if len(nexts) != len(chain) - 1:
        raise ValueError(f"script tokens repeat, a bigram chain cannot follow it: {script!r}")
    vocab = len(tok)
    model = Qwen3ForCausalLM(_config(vocab, vocab, 1, head_dim))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "lm_head.weight")):
                p.zero_()  # layers add nothing: the final hidden state is the last token's embedding
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        for a, b in nexts.items():
            model.lm_head.weight[b, a] = 40.0 / vocab**0.5  # RMSNorm scales a one-hot by sqrt(hidden)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_model(tmp_path_factory.mktemp("random_model"))


@pytest.fixture(scope="session")
def scripted(tmp_path_factory: pytest.TempPathFactory):
    """`scripted(*pieces) -> folder`, cached per script."""
    made: dict[tuple[str, ...], Path] = {}

    def get(*script: str) -> Path:
        if script not in made:
            made[script] = make_scripted_model(tmp_path_factory.mktemp("scripted"), script)
        return made[script]

    return get


def needs_vllm() -> pytest.MarkDecorator:
    """Skip a vLLM test where no vLLM venv is found (scripts/install_vllm.sh makes one), except where
    $AGENTRL_VLLM_PYTHON is set (CI): there a missing venv fails the test instead of skipping it."""
    import os

    from agentrl.inference.engines.vllm.servers import PYTHON_ENV, VLLMError, vllm_python

    try:
        vllm_python()
        missing = ""
    except VLLMError as exc:
        missing = str(exc)
    return pytest.mark.skipif(bool(missing) and not os.environ.get(PYTHON_ENV), reason=f"no vLLM: {missing}")

