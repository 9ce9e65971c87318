"""inference=vllm without a server: the schema's refusals, finding vLLM's venv, and the launch command.

These run everywhere (no vLLM needed); tests/inference/test_vllm.py drives a real server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config.inference import VLLMInferenceConfig
from agentrl.inference.engines.vllm import servers as vllm_servers
from agentrl.inference.engines.vllm.generate import sampling_params, to_completion
from agentrl.inference.engines.vllm.servers import (
    PYTHON_ENV,
    VLLMError,
    cpu_binds,
    launch_command,
    launch_envs,
    server_env,
    vllm_python,
)


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_servers": 0}, "inference.num_servers must be an integer >= 1"),
    ({"kv_cache_gib": 0}, "inference.kv_cache_gib must be an integer >= 1"),
    ({"health_every_s": 0.0}, "inference.health_every_s must be a finite number > 0"),
    ({"dtype": "fp8"}, "inference.dtype must be one of"),
    ({"restart": True, "urls": ["http://gpu1:8000"]}, "inference.restart=true restarts servers agentrl launched"),
])
def test_schema_refuses_each_invariant_naming_the_key(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VLLMInferenceConfig(**fields)


def test_the_venv_is_found_or_the_error_says_how_to_make_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    monkeypatch.setattr(vllm_servers, "DEFAULT_VENV", tmp_path / "absent")
    with pytest.raises(VLLMError, match="scripts/install_vllm.sh"):
        vllm_python()
    with pytest.raises(VLLMError, match=r"inference.python=/no/such/python does not exist"):
        vllm_python("/no/such/python")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.setenv(PYTHON_ENV, str(python))
    assert vllm_python() == str(python)
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "gone"))
    with pytest.raises(VLLMError, match=f"\\${PYTHON_ENV}="):
        vllm_python()


def test_the_launch_command_asks_for_the_learners_logprobs_and_the_token_route() -> None:
    argv = launch_command("/venv/bin/python", "/m", 26001, max_model_len=1024, extra_args=["--seed", 3])
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model"] == "/m" and flags["--port"] == "26001" and flags["--logprobs-mode"] == "processed_logprobs"
    assert "--enable-scale-out" in argv and "--enforce-eager" in argv and argv[-2:] == ["--seed", "3"]
    assert "--enforce-eager" not in launch_command("p", "/m", 1, enforce_eager=False)
    env = server_env(2, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and "PYTHONPATH" not in env


def test_servers_launched_on_one_host_get_disjoint_cores() -> None:
    assert cpu_binds(1, [0, 1, 2, 3]) == [None]  # one server: vLLM's own "auto"
    assert cpu_binds(2, [0, 1]) == ["0", "1"]
    assert cpu_binds(3, [7, 0, 1, 2, 3, 4, 5]) == ["0,1,2", "3,4", "5,7"]  # the remainder to the first ones
    assert cpu_binds(3, [0, 1]) == ["nobind"] * 3
    base = {"A": "1"}
    envs = launch_envs(2, base, cpus=[0, 1, 2, 3])
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == ["0,1", "2,3"] and all(e["A"] == "1" for e in envs)
    assert launch_envs(1, base, cpus=[0, 1]) == [base]
    mine = {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}  # inference.server_env sets it: every server keeps it
    assert launch_envs(2, mine, cpus=[0, 1]) == [mine, mine]


def test_sampling_values_are_mapped_to_what_vllm_takes() -> None:
    p = sampling_params(8, 0.6, 1.0, -1, [2, 5], -3, False)
    assert p["top_k"] == 0 and p["seed"] == (-3) % (1 << 63) and p["stop_token_ids"] == [2, 5]
    assert p["logprobs"] == 0 and p["skip_special_tokens"] is False  # the sampled token's logprob, ids as sampled


def test_an_answer_is_a_completion_or_an_error_naming_the_server() -> None:
    body = {"choices": [{"token_ids": [4, 2], "finish_reason": "stop",
                         "logprobs": {"content": [{"token_id": 4, "logprob": -0.5}, {"token_id": 2, "logprob": -0.1}]},
                         "weight_versions": [{"version": "3", "start": 0, "end": 2}]}]}
    done = to_completion(body, "http://h:1", 7)
    assert (done.token_ids, done.logprobs, done.finish_reason, done.weight_version, done.prompt_tokens) == \
        ([4, 2], [-0.5, -0.1], "stop", 3, 7)
    assert done.token_versions == [] and done.versions() == [3, 3]
    # A kept push (partial rollouts) mid-reply: each token's version; staleness counts from the first.
    body["choices"][0]["weight_versions"] = [{"version": "3", "start": 0, "end": 1}, {"version": "4", "start": 1,
                                                                                      "end": 2}]
    done = to_completion(body, "http://h:1", 7)
    assert (done.weight_version, done.token_versions) == (3, [3, 4])
    for spans in ([{"version": "4", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 2}],  # goes back
                  [{"version": "3", "start": 0, "end": 1}, {"version": "4", "start": 2, "end": 2}],  # a gap
                  [{"version": "3", "start": 1, "end": 2}]):  # not from the first token
        body["choices"][0]["weight_versions"] = spans
        with pytest.raises(VLLMError, match="http://h:1 sampled one reply with weight-version spans"):
            to_completion(body, "http://h:1", 7)
    body["choices"][0]["weight_versions"] = [{"version": "3", "start": "x"}]
    with pytest.raises(VLLMError, match="a weight-version span that is not one"):
        to_completion(body, "http://h:1", 7)
    with pytest.raises(VLLMError, match="http://h:1/inference/v1/generate answered no token ids"):
        to_completion({"error": "x"}, "http://h:1", 7)
    body = {"choices": [{"token_ids": [4], "finish_reason": "abort", "logprobs": {"content": [{"logprob": -1}]}}]}
    with pytest.raises(VLLMError, match="finish_reason='abort'"):
        to_completion(body, "http://h:1", 7)
