"""inference=vllm against a real vLLM server (vLLM's CPU build, in the venv of scripts/install_vllm.sh).

One server for the module (it takes minutes to start on a loaded box), serving a scripted model whose greedy reply
is known: a chat with tools round-trips through our session server; a weight push changes what it samples and
the version it reports; its logprobs are the learner's (after temperature); a push kept in a running reply
(partial rollouts) lands mid-reply; an engine attaches to a running server; a killed server is restarted with its
weights (inference.restart) and, last, a killed server is named within seconds. A server that cannot start fails
with its log's tail; GRPO steps through the CLI launch their own server. Skipped, saying why, only where the vLLM
venv is absent and $AGENTRL_VLLM_PYTHON is unset (CI's scripts/test.sh makes the venv and sets it, so there they
run).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import torch

from agentrl.inference.engines.completion import EngineUnavailable
from agentrl.inference.engines.vllm.servers import VLLMError
from agentrl.testing.cli import run_agentrl
from agentrl.testing.scripted_phrases import CALL_MUL
from tests.inference.conftest import make_scripted_model, needs_vllm

pytestmark = [pytest.mark.slow, needs_vllm()]

SCRIPT_A = ("Let me compute.\n", CALL_MUL)
SCRIPT_B = ("The answer is 3.", " Done.")
TOOLS = [{"type": "function", "function": {"name": "mul", "description": "x times 3",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]


def _state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two scripted models of one shape (they differ in their reply only), head_dim 32 for vLLM's CPU attention."""
    return {name: make_scripted_model(tmp_path_factory.mktemp(f"scripted_{name}"), script, head_dim=32)
            for name, script in (("a", SCRIPT_A), ("b", SCRIPT_B))}


@pytest.fixture(scope="module")
def served(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    from agentrl.inference.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(models["a"], max_model_len=1024, health_every_s=0.5,
                        log_dir=tmp_path_factory.mktemp("vllm_logs"))
    yield engine
    engine.close()


def _greedy(engine, prompt: list[int], **kw):
    return asyncio.run(engine.generate(prompt, max_tokens=40, temperature=0.0, **kw))


def _prompt(engine) -> list[int]:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": "3 times 3?"}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)


def _reply(engine, completion) -> str:
    return engine.tokenizer.decode(completion.token_ids, skip_special_tokens=False)


def test_a_chat_with_tools_round_trips_through_the_session_server(served) -> None:
    from agentrl.inference.sessions.server import start_session_server

    server = start_session_server(served, tool_format="qwen", default_max_tokens=40)
    try:
        with httpx.Client(base_url=server.base_url, timeout=600, trust_env=False) as http:
            sid = http.post("/sessions").json()["session_id"]
            messages = [{"role": "user", "content": "3 times 3?"}]
            first = http.post(f"/sessions/{sid}/v1/chat/completions",
                              json={"messages": messages, "tools": TOOLS, "temperature": 1.0}).json()
            choice = first["choices"][0]
            assert choice["finish_reason"] == "tool_calls", first
            call = choice["message"]["tool_calls"][0]["function"]
            assert call["name"] == "mul" and '"x": 3' in call["arguments"]
            meta = choice["meta_info"]
            ids = [t for _, t in meta["output_token_logprobs"]]
            assert ids[-1] == served.tokenizer.convert_tokens_to_ids("<|im_end|>")  # the stop token is kept
            assert all(math.isfinite(lp) and lp <= 0 for lp, _ in meta["output_token_logprobs"])
            assert meta["weight_version"] == served.weight_version
            call_id = choice["message"]["tool_calls"][0]["id"]
            messages += [choice["message"], {"role": "tool", "tool_call_id": call_id, "content": "9"}]
            second = http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": messages, "tools": TOOLS})
            assert second.status_code == 200, second.text
            session = http.get(f"/sessions/{sid}").json()
        one, two = (r["request"]["input_ids"] for r in session["records"])
        # Token-in/token-out: turn 2's prompt is turn 1's prompt and sampled ids, exactly, then the tool's turn.
        assert two[:len(one) + len(ids)] == one + ids
        assert session["metadata"]["accumulated_token_ids"][:len(two)] == two
    finally:
        server.stop()


def test_a_weight_push_changes_what_it_samples_and_its_version(served, models) -> None:
    prompt = _prompt(served)
    before = _greedy(served, prompt)
    assert "<tool_call>" in _reply(served, before)
    version = served.update_weights(_state(models["b"]))
    assert version == before.weight_version + 1 == served.weight_version
    held = httpx.get(f"{served.urls[0]}/weight_info", trust_env=False).json()["weight_version"]
    assert held == str(version)  # read back from the server, not assumed
    after = _greedy(served, prompt)
    assert after.weight_version == version
    assert "The answer is 3. Done." in _reply(served, after) and after.token_ids != before.token_ids
    # A folder works as a source too: the first model again, one version later.
    assert served.update_weights(models["a"]) == version + 1
    assert _greedy(served, prompt).token_ids == before.token_ids


def test_its_logprobs_are_the_learners_after_temperature(served, models) -> None:
    """Softened weights (the scripted reply is only likely): sampled at T=0.7, the engine's logprob of each sampled
    token is log_softmax(logits / 0.7) of the learner's forward pass on the same ids, not the raw log_softmax."""
    from transformers import AutoModelForCausalLM

    state = _state(models["a"])
    state["lm_head.weight"] = state["lm_head.weight"] * 0.1
    served.update_weights(state)
    prompt = _prompt(served)
    done = asyncio.run(served.generate(prompt, max_tokens=12, temperature=0.7, seed=5, ignore_eos=True))
    model = AutoModelForCausalLM.from_pretrained(models["a"], dtype=torch.float32).eval()
    model.load_state_dict(state)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + done.token_ids])).logits[0, len(prompt) - 1:-1]
    picked = torch.tensor(done.token_ids)[:, None]
    learner = torch.log_softmax(logits / 0.7, -1).gather(-1, picked).squeeze(-1)
    raw = torch.log_softmax(logits, -1).gather(-1, picked).squeeze(-1)
    engine = torch.tensor(done.logprobs)
    assert len(done.token_ids) == 12
    assert (engine - learner).abs().max().item() < 1e-3, (engine, learner)
    assert (engine - raw).abs().max().item() > 1e-2  # the convention is visible at this temperature


def test_a_kept_push_lands_inside_a_running_reply(served, models) -> None:
    """Partial rollouts (`update_weights(mode="keep")`): the push freezes the running replies, swaps the weights and
    lets them go on. A reply's tokens carry both versions, in order, and those after the push are the new weights'
    own: greedy, exactly model b's continuation of the same prefix (and those before it model a's)."""
    prompt = _prompt(served)
    n = 1024 - len(prompt) - 8  # long replies (EOS ignored), a batch of them: the push lands while they run

    async def play(replies: int, delay: float):
        running = [asyncio.create_task(served.generate(prompt, max_tokens=n, temperature=0.0, ignore_eos=True))
                   for _ in range(replies)]
        await asyncio.sleep(delay)
        version = await asyncio.to_thread(served.update_weights, _state(models["b"]), mode="keep")
        return await asyncio.gather(*running), version

    # When a reply is under way cannot be seen from outside, and how fast it runs depends on the box: on a busy
    # one the replies can take seconds to start, and on a throttled VM every process on it (this one included)
    # can stall for seconds while the server decodes, so a batch can start and finish inside one stall. Each
    # try reads its outcome and moves: a push too early (every token the new version's) waits longer next time;
    # one too late (none) gets twice the replies, so the decoding outlasts the stalls, and pushes sooner.
    replies, delay, outcomes = 16, 0.3, []
    for _ in range(10):
        served.update_weights(models["a"])
        before = served.weight_version
        done, version = asyncio.run(play(replies, delay))
        split = [d for d in done if d.token_versions]
        if split:
            break
        early = all(d.weight_version == version for d in done)
        outcomes.append(f"{replies} replies, push after {delay:.2f} s: too {'early' if early else 'late'}")
        replies, delay = (replies, delay * 2) if early else (min(2 * replies, 256), delay / 2)
    else:
        raise AssertionError("no push landed inside a running reply: " + "; ".join(outcomes))
    assert version == before + 1 == served.weight_version
    assert httpx.get(f"{served.urls[0]}/weight_info", trust_env=False).json()["weight_version"] == str(version)
    for d in done:  # every reply whole, its tokens of the two versions only, the old ones first
        assert len(d.token_ids) == n and set(d.versions()) <= {before, version} and d.versions() == sorted(d.versions())
    reply = split[0]
    k = reply.token_versions.index(version)
    assert reply.weight_version == before and 0 < k < n
    assert reply.token_versions == [before] * k + [version] * (n - k)
    rest = asyncio.run(served.generate(prompt + reply.token_ids[:k], max_tokens=n - k, temperature=0.0,
                                       ignore_eos=True))
    assert rest.token_ids == reply.token_ids[k:] and rest.weight_version == version
    served.update_weights(models["a"])
    head = asyncio.run(served.generate(prompt, max_tokens=k, temperature=0.0, ignore_eos=True))
    assert head.token_ids == reply.token_ids[:k]
    with pytest.raises(ValueError, match="mode must be wait or keep"):
        served.update_weights(models["a"], mode="later")


def test_an_engine_attaches_to_a_running_server(served, models) -> None:
    """inference.urls: the running server is made to serve the trainer's folder (version 0), then samples it."""
    from agentrl.inference.engines.vllm.engine import VLLMEngine

    attached = VLLMEngine(models["b"], urls=served.urls, health_every_s=0.5)
    try:
        assert attached.weight_version == 0
        assert httpx.get(f"{served.urls[0]}/weight_info", trust_env=False).json()["weight_version"] == "0"
        assert "The answer is 3." in _reply(attached, _greedy(attached, _prompt(attached)))
    finally:
        attached.close()  # not its server: it keeps running
    assert httpx.get(f"{served.urls[0]}/health", trust_env=False).status_code == 200


def test_a_restarted_server_loses_no_call_and_keeps_the_weights(served, models) -> None:
    """inference.restart=true: a call sent while its server lies dead waits for the restart and is answered by
    the same weights and version the engine had pushed before the death."""
    url = served.urls[0]
    served.restart = True
    try:
        version = served.update_weights(_state(models["b"]))
        pid = served._servers[url].proc.pid
        os.killpg(pid, signal.SIGKILL)
        done = _greedy(served, _prompt(served))  # refused at first: retried once the server is back
        assert served.failure is None and served.restarts == 1 and served._servers[url].proc.pid != pid
        assert done.weight_version == version
        assert "The answer is 3. Done." in _reply(served, done)
    finally:
        served.restart = False


def test_a_killed_server_fails_fast_naming_it(served) -> None:
    """Last in the module (it ends the shared server): the watcher names the dead server within seconds, the
    session server's /health says so, and a new call fails with its URL instead of waiting."""
    from agentrl.inference.sessions.server import start_session_server

    url = served.urls[0]
    server = start_session_server(served, tool_format="qwen")
    try:
        os.killpg(served._servers[url].proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        while served.failure is None and time.monotonic() - killed < 120:  # generous on a loaded box
            time.sleep(0.2)
        assert served.failure is not None, "the dead server was not noticed"
        assert url in str(served.failure) and "exited" in str(served.failure)
        health = httpx.get(f"{server.base_url}/health", trust_env=False)
        assert health.status_code == 503 and url in health.json()["error"]
        with pytest.raises(EngineUnavailable, match=url):
            _greedy(served, _prompt(served))
    finally:
        server.stop()


def test_a_server_that_cannot_start_fails_the_setup_with_its_log_tail(models, tmp_path: Path) -> None:
    from agentrl.inference.engines.vllm.engine import VLLMEngine

    with pytest.raises(VLLMError, match=r"(?s)exited with .*no-such-flag"):
        VLLMEngine(models["a"], extra_args=["--no-such-flag"], log_dir=tmp_path)


def test_two_launched_servers_each_serve_on_cores_of_their_own(models, tmp_path: Path) -> None:
    """inference.num_servers=2 on one host: both answer, and each binds its own cores (vLLM's "auto" would bind
    both to the same ones); the core lists are read from the servers' own logs."""
    import re

    from agentrl.inference.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(models["a"], num_servers=2, max_model_len=1024, health_every_s=0.5, log_dir=tmp_path)
    try:
        assert len(engine.urls) == 2
        for url in engine.urls:
            assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        cores = []
        for i in range(2):
            found = re.findall(r"core ids=\[([0-9, ]*)\]", (tmp_path / f"vllm-{i}.log").read_text())
            cores.append(set(found[-1].replace(" ", "").split(",")) if found else None)
    finally:
        engine.close()
    if len(os.sched_getaffinity(0)) >= 2:
        assert cores[0] and cores[1] and not cores[0] & cores[1], cores
    else:  # one core: no pinning, so vLLM logs no core list
        assert cores == [None, None]


# Keys each backend logs per step through vLLM. TRL (its own GRPOTrainer, our rollout_func) generates through the
# same engine and pushes TRL's weights to it each optimizer step; the logprob gap and weight lag are the built-in
# trainer's (TRL computes its own importance ratios).
STEP_KEYS = {"grpo": ("train/reward", "train/loss", "train/grad_norm", "train/logprob_gap_mean",
                      "train/logprob_gap_max", "time/weight_push_s", "rollout/weight_lag"),
             "trl": ("train/reward", "train/loss", "train/grad_norm", "time/weight_push_s", "trl/loss")}


@pytest.mark.parametrize(("trainer", "extra"), [
    ("grpo", []), ("trl", []),
    # partial rollouts: pushes land in running replies (kept), two steps ahead at most
    ("grpo", ["trainer.partial_rollouts=true", "trainer.max_staleness=2"]),
], ids=["grpo", "trl", "grpo-partial"])
def test_two_steps_through_the_cli_log_finite_metrics_and_the_logprob_gap(tmp_path: Path, trainer: str,
                                                                          extra: list[str]) -> None:
    home = tmp_path / "home"
    # head_dim 64 / 2 = 32: vLLM's CPU attention has no smaller head. The untrained model's replies are cut and
    # flagged truncated (not scored): both trainers keep them at reward 0 (penalize, drop_no_signal=false) so each
    # step trains real tokens and measures their gap; no warm start, so one server serves the whole run.
    args = ["+recipe=gridsim_grpo", f"trainer={trainer}", "inference=vllm", "trainer.steps=2",
            "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_every=0", "trainer.eval_limit=2",
            "trainer.checkpoint_every=0", "trainer.warm_start.enabled=false", "agent.max_response_tokens=16",
            "trainer.model_failures=penalize", "trainer.max_extra_rows=0",
            *(["trainer.drop_no_signal=false"] if trainer == "grpo" else []),  # TRL: advantage 0, tokens still sent
            "model.hidden_size=64", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
            "model.intermediate_size=128", "model.vocab_size=1024", "inference.max_model_len=2048", *extra]
    client = run_agentrl(args, home, seed_model=False, seed_store=False).client()  # the run builds model and store
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    assert runs[0].data.params["inference/_target_"] == "agentrl.inference.engines.vllm.engine.VLLMEngine"
    for key in STEP_KEYS[trainer] + (("async/resumed_partial",) if extra else ()):
        history = client.get_metric_history(run_id, key)
        assert [m.step for m in history] == [1, 2], f"{key}: {history}"
        assert all(math.isfinite(m.value) for m in history), f"{key} = {[m.value for m in history]}"
    tokens = client.get_metric_history(run_id, "train/tokens")
    assert all(m.value > 0 for m in tokens), tokens  # the cut replies train (penalized), so the gap is of real tokens
    pushes = client.get_metric_history(run_id, "time/weight_push_s")
    assert pushes[-1].value > 0  # step 2's rollouts sampled weights pushed to the server (version read back)
    if trainer == "trl":
        return
    gap = client.get_metric_history(run_id, "train/logprob_gap_max")
    assert all(0 <= m.value < 1.0 for m in gap), gap  # vLLM's kernels are not the learner's, but close in float32
