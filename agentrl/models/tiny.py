"""`model=tiny`: a Qwen3-architecture causal LM of a few million parameters and its tokenizer, made locally.

The folder is built once (tokenizer trained on generated text, weights randomly initialised from `seed`)
and then reused. Building happens in a temporary sibling folder that is renamed into place, under a file
lock, so concurrent callers never see a half-written model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config.model import TinyModelConfig as Tiny  # the defaults' one home: model=tiny's schema
from agentrl.fsutil import atomic_dir, file_lock, make_readable

log = logging.getLogger(__name__)

# Qwen3's names. The first three are special (skipped by `decode(..., skip_special_tokens=True)`); the tags
# are ordinary added tokens, as in Qwen3, so tool-call and think blocks survive decoding and can be parsed.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CONTROL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"

# Pre-tokenization: a number is its own piece (up to 3 digits, with an optional leading space, minus sign
# and one '.' or ','), so " 19", ", -1" and ".25" become single tokens and a schedule like [0, 1, -1, ...]
# costs one token an entry. Text between numbers may merge across spaces (up to MAX_TOKEN_CHARS), which
# turns the chat template's and the tools' fixed wording into a few tokens.
PRETOKENIZE_PATTERN = r"[.,]? ?-?\d{1,3}|\n+|[^\d\n]+?(?=[.,]? ?-?\d|\n|$)"
MAX_TOKEN_CHARS = 16

# 2: the compact GridSim prompt's short tool schema joined the tokenizer's corpus.
BUILDER_VERSION = 2
MARKER = "agentrl_tiny.json"
# Settings that shape the weights or the tokenizer; the cached folder must match them all.
SETTINGS = ("seed", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
            "max_position_embeddings")


def ensure_tiny_model(path: str, seed: int = Tiny.seed, vocab_size: int = Tiny.vocab_size,
                      hidden_size: int = Tiny.hidden_size, num_layers: int = Tiny.num_layers,
                      num_heads: int = Tiny.num_heads, num_kv_heads: int = Tiny.num_kv_heads,
                      intermediate_size: int = Tiny.intermediate_size,
                      max_position_embeddings: int = Tiny.max_position_embeddings, chat_template: str | None = None,
                      template_dir: str | None = None, **_: Any) -> str:
    """Build the tiny model's Hugging Face folder at `path` unless it is already there; return `path`.

    The same settings always give bit-identical weights; the tokenizer does not depend on `seed`. A folder
    already at `path` that was built with other settings raises ValueError rather than being reused. With
    `chat_template` (a file), returns the folder that serves the model with that template instead.
    """
    settings = {"seed": seed, "vocab_size": vocab_size, "hidden_size": hidden_size, "num_layers": num_layers,
                "num_heads": num_heads, "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size,
                "max_position_embeddings": max_position_embeddings}
    _check_settings(settings)
    target = Path(path).expanduser().absolute()
    _ensure_built(target, settings)
    if not chat_template:
        return str(target)
    from agentrl.models.chat_templates import with_chat_template

    return with_chat_template(target, chat_template, template_dir)


def _ensure_built(target: Path, settings: dict[str, int]) -> None:
    if _is_built(target, settings):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if _is_built(target, settings):  # another process finished it while we waited
            return
        with atomic_dir(target, tag="building") as tmp:
            build_tiny_model(tmp, **settings)
            make_readable(tmp)


# The plan does not build the tiny model (it is made on first use, with agentrl's own chat template).
ensure_tiny_model.builds_on_demand = True  # type: ignore[attr-defined]


def build_tiny_model(out_dir: str | Path, **settings: Any) -> Path:
    """Write tokenizer, config, weights and the build record into `out_dir` (which must exist)."""
    import torch
    import transformers

    from .corpus import chat_template, corpus

    started = time.monotonic()
    out = Path(out_dir)
    texts, sources = corpus()
    tokenizer = train_tokenizer(texts, settings["vocab_size"], settings["max_position_embeddings"])
    tokenizer.chat_template = chat_template()
    tokenizer.save_pretrained(out)
    _finish_tokenizer_config(out, tokenizer.chat_template)

    model = init_model(tokenizer, **settings)
    model.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    record = {
        "builder_version": BUILDER_VERSION,
        "settings": {k: settings[k] for k in SETTINGS},
        "parameters": n_params,
        "tokenizer_size": len(tokenizer),
        "corpus_sources": sources,
        "corpus_sha256": hashlib.sha256("\0".join(texts).encode()).hexdigest(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    # Written last: its presence marks a complete folder.
    (out / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    log.info("built tiny model (%d parameters, corpus from %s) in %.1fs", n_params, "+".join(sources),
             time.monotonic() - started)
    return out


def train_tokenizer(texts: Sequence[str], vocab_size: int, model_max_length: int = 2048) -> Any:
    """A byte-level BPE tokenizer with Qwen3's special tokens, trained on `texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    reserved = [*SPECIAL_TOKENS, *CONTROL_TOKENS]  # ids 0..8, in this order
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=reserved, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  max_token_length=MAX_TOKEN_CHARS)
    tok.train_from_iterator(texts, trainer)
    # The trainer registers every reserved token as special; the tags must not be, so that decoding with
    # skip_special_tokens=True keeps tool calls intact (as Qwen3's tokenizer does).
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in SPECIAL_TOKENS
        added["normalized"] = False
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   model_max_length=model_max_length, padding_side="left",
                                   clean_up_tokenization_spaces=False)


def init_model(tokenizer: Any, seed: int, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
               num_kv_heads: int, intermediate_size: int, max_position_embeddings: int) -> Any:
    """A randomly initialised float32 Qwen3ForCausalLM; the same arguments give bit-identical weights."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids([EOS_TOKEN, PAD_TOKEN])
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=pad,
    )
    # Fork so a build inside a caller's process leaves the caller's RNG stream untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=None)
    return model.eval()


def _check_settings(s: dict[str, Any]) -> None:
    for key, value in s.items():
        if isinstance(value, bool) or not isinstance(value, int) or (value < 0 if key == "seed" else value <= 0):
            raise ValueError(f"tiny model: {key} must be a {'non-negative' if key == 'seed' else 'positive'} "
                             f"integer, got {value!r}")
    if s["vocab_size"] < 512:
        raise ValueError(f"tiny model: vocab_size must be at least 512 (256 bytes + special tokens + merges), "
                         f"got {s['vocab_size']}")
    if s["hidden_size"] % s["num_heads"]:
        raise ValueError(f"tiny model: hidden_size {s['hidden_size']} is not divisible by num_heads {s['num_heads']}")
    if s["num_heads"] % s["num_kv_heads"]:
        raise ValueError(f"tiny model: num_heads {s['num_heads']} is not divisible by num_kv_heads "
                         f"{s['num_kv_heads']}")


def _is_built(target: Path, settings: dict[str, Any]) -> bool:
    if not target.exists():
        return False
    marker = target / MARKER
    if not marker.is_file():
        raise ValueError(f"{target} exists but is not a tiny model built by agentrl (no {MARKER}); "
                         "remove it or choose another model.path")
    built = json.loads(marker.read_text())
    if built.get("builder_version") != BUILDER_VERSION:
        log.warning("%s was built by tiny-model builder version %s (this agentrl's is %s): it still works, but its "
                    "tokenizer was trained on older prompts; remove the folder to rebuild it",
                    target, built.get("builder_version"), BUILDER_VERSION)
    if built.get("settings") != {k: settings[k] for k in SETTINGS}:
        raise ValueError(f"{target} holds a tiny model built with {built.get('settings')}, not {settings}; "
                         "remove it or choose another model.path")
    return True


def _finish_tokenizer_config(out: Path, template: str) -> None:
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # transformers 5 names the class TokenizersBackend, which 4.x does not know; both load this alias.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # transformers 5 saves the template as chat_template.jinja; 4.x readers (and some serving engines) look
    # in tokenizer_config.json, so it is kept in both, identical.
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
