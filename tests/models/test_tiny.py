"""model=tiny: a locally made Qwen3-architecture model and tokenizer; model=hf: loading such a folder."""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from agentrl.models.hf import load_model_and_tokenizer, local_model
from agentrl.models.tiny import CONTROL_TOKENS, MARKER, SPECIAL_TOKENS, ensure_tiny_model, init_model


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True)


def test_folder_loads_as_qwen3_with_qwen3_special_tokens(tiny_model_dir, tiny_tokenizer):
    model = load(tiny_model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32
    tok = tiny_tokenizer
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for i, name in enumerate((*SPECIAL_TOKENS, *CONTROL_TOKENS)):
        assert tok.convert_tokens_to_ids(name) == i
        assert tok(name, add_special_tokens=False)["input_ids"] == [i]  # never split
    assert model.config.eos_token_id == tok.eos_token_id
    assert tok.eos_token_id in model.generation_config.eos_token_id
    assert len(tok) <= model.config.vocab_size
    # Tags survive skip_special_tokens (so tool calls can be parsed); the chat markers do not.
    ids = tok("<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


def test_parameter_count_is_a_few_million(tiny_model_dir):
    record = json.loads((tiny_model_dir / MARKER).read_text())
    n = sum(p.numel() for p in load(tiny_model_dir).parameters())
    assert n == record["parameters"]
    assert 1_000_000 <= n <= 3_000_000, n


def test_text_round_trips_and_numbers_are_compact(tiny_tokenizer):
    text = 'Prices: 19.18 -5 2024-02-08 {"schedule": [0, 1, -1]} naïve ✓'
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    prices = " ".join(str(x) for x in range(10, 100, 4))  # 23 two-digit numbers
    assert len(tiny_tokenizer(prices, add_special_tokens=False)["input_ids"]) == 23


def test_one_seed_gives_identical_weights_and_tokenizer(tiny_model_dir, tiny_tokenizer, tmp_path):
    # Two callers racing on one new folder: one builds, the other waits and reuses it; no temp folder is left.
    target = tmp_path / "again" / "tiny-s0"
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: ensure_tiny_model(str(target), seed=0), range(2)))
    assert paths == [str(target)] * 2
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")) == ["tiny-s0"]
    a, b = load(tiny_model_dir).state_dict(), load(target).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tiny_model_dir / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()
    # Another seed gives other weights.
    other = init_model(tiny_tokenizer, **{**json.loads((target / MARKER).read_text())["settings"], "seed": 1})
    assert not torch.equal(other.state_dict()["model.embed_tokens.weight"], a["model.embed_tokens.weight"])


def test_a_built_folder_is_reused_and_checked(tiny_model_dir, tmp_path):
    weights = tiny_model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    # Reused, not rebuilt: the weights file is untouched (a file check, not a timing a loaded box could miss).
    assert ensure_tiny_model(str(tiny_model_dir), seed=0) == str(tiny_model_dir)
    assert weights.stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="built with"):
        ensure_tiny_model(str(tiny_model_dir), seed=0, num_heads=8)
    (tmp_path / "stranger").mkdir()
    with pytest.raises(ValueError, match="not a tiny model"):
        ensure_tiny_model(str(tmp_path / "stranger"))
    with pytest.raises(ValueError, match="divisible"):
        ensure_tiny_model(str(tmp_path / "x"), hidden_size=130)
    with pytest.raises(ValueError, match="positive"):
        ensure_tiny_model(str(tmp_path / "x"), num_layers=0)


def test_generates_and_stops_at_im_end(tiny_model_dir, tiny_tokenizer):
    """Teach the model one reply in 150 steps (60 fell one token short on one CPU); greedy decoding then follows
    it and stops at <|im_end|>.

    Training is not bit-exact across torch/transformers builds and thread counts, so the checks are properties
    a working model/tokenizer/generation path has and a broken one (no learning, wrong labels, EOS ignored) lacks,
    not the exact memorized string.
    """
    torch.manual_seed(0)
    model = load(tiny_model_dir)
    tok = tiny_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "D=1 eta=90 P=10 | 5 40"}],
                                     add_generation_prompt=True, tokenize=False)
    reply = '<tool_call>\n{"name": "submit_schedule", "arguments": {"schedule": [1, -1]}}\n</tool_call><|im_end|>'
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    reply_ids = tok(reply, add_special_tokens=False)["input_ids"]
    assert reply_ids[-1] == im_end
    ids = torch.tensor([prompt_ids + reply_ids])
    labels = ids.clone()
    labels[0, :len(prompt_ids)] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(150):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    # It learned: the loss fell by orders of magnitude, and teacher-forced argmax gets nearly every reply token.
    assert losses[-1] < 0.05 * losses[0], (losses[0], losses[-1])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1]
    predicted = logits.argmax(-1).tolist()
    hits = sum(p == t for p, t in zip(predicted, reply_ids, strict=True))
    assert hits >= 0.9 * len(reply_ids), (hits, len(reply_ids))
    # Greedy decoding stops at <|im_end|> (the EOS the model's generation config names), well before the cap...
    out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                         max_new_tokens=100, do_sample=False)
    new = out[0, len(prompt_ids):].tolist()
    assert new[-1] == im_end and new.count(im_end) == 1 and len(new) < 100, tok.decode(new)
    # ...and what it wrote is the shape it was taught: a tool call, closed, then the end of the turn.
    text = tok.decode(new)
    assert text.startswith("<tool_call>\n") and text.endswith("</tool_call><|im_end|>"), text


def gridsim_compact_demo():
    try:
        from agentrl.envs.bundles import load_bundle

        bundle = load_bundle(bundle="gridsim", prompt_style="compact")
    except Exception as e:  # noqa: BLE001 - the GridSim bundle is built separately
        pytest.skip(f"GridSim bundle not available: {type(e).__name__}: {e}")
    return bundle, bundle.demonstration("eval", 144, "optimal")


def test_gridsim_compact_prompt_and_optimal_call_fit_in_300_tokens(tiny_tokenizer):
    bundle, demo = gridsim_compact_demo()
    tools = bundle.episode("eval", 144).first_turn().tools
    prompt_and_call = demo[:3]
    assert prompt_and_call[2]["role"] == "assistant" and prompt_and_call[2]["tool_calls"]
    ids = tiny_tokenizer.apply_chat_template(prompt_and_call, tools=tools, tokenize=True, return_dict=False)
    assert len(ids) < 300, len(ids)
    # The user prompt itself (24 prices) is a few dozen tokens.
    user = tiny_tokenizer(demo[1]["content"], add_special_tokens=False)["input_ids"]
    assert len(user) <= 40, len(user)


def test_hf_loads_a_folder_saved_by_tiny(tiny_model_dir):
    assert local_model(str(tiny_model_dir)) == str(tiny_model_dir)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    from huggingface_hub import constants

    assert constants.is_offline_mode()
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    assert model.dtype == torch.float32 and not model.training
    assert tok.chat_template and type(model).__name__ == "Qwen3ForCausalLM"
    model16, _ = load_model_and_tokenizer(str(tiny_model_dir), dtype="bfloat16")
    assert model16.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model_and_tokenizer(str(tiny_model_dir), dtype="float7")


def test_hf_rejects_unusable_folders(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        local_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        local_model(str(tmp_path / "empty"))
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_model_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no weights"):
        local_model(str(no_weights))
    no_template = tmp_path / "no_template"
    shutil.copytree(tiny_model_dir, no_template)
    (no_template / "chat_template.jinja").unlink()
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat template"):
        local_model(str(no_template))
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_model_dir, no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (no_tokenizer / name).unlink()
    with pytest.raises(ValueError, match="no tokenizer files"):
        local_model(str(no_tokenizer))
    broken = tmp_path / "broken_tokenizer"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer does not load offline"):
        local_model(str(broken))
    with pytest.raises(ValueError, match="needs model.path"):
        local_model("???")


def test_folder_is_readable_by_others(tiny_model_dir):
    assert Path(tiny_model_dir).stat().st_mode & 0o005 == 0o005
    assert (tiny_model_dir / "model.safetensors").stat().st_mode & 0o004
