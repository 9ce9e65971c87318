"""inference=sglang: launch commands, and generation and weight pushes against stand-in SGLang servers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.inference.engines.embedded.engine import Completion
from agentrl.inference.engines.sglang import SGLangEngine, SGLangError, launch_commands
from tests.miles.conftest import logprob_of


def test_launch_commands_one_server_per_gpu_with_the_parsers():
    cmds = launch_commands("/m/Qwen3-4B", num_gpus=2, base_port=31000, mem_fraction_static=0.6,
                           tool_call_parser="qwen25", reasoning_parser="qwen3", extra_args=["--dtype", "bfloat16"],
                           python="/usr/bin/python3")
    assert [env for _, env in cmds] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    argv = cmds[1][0]
    assert argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model-path"] == "/m/Qwen3-4B" and flags["--port"] == "31001" and flags["--host"] == "127.0.0.1"
    assert flags["--tool-call-parser"] == "qwen25" and flags["--reasoning-parser"] == "qwen3"
    assert flags["--mem-fraction-static"] == "0.6" and flags["--weight-version"] == "0"
    assert argv[-2:] == ["--dtype", "bfloat16"]
    assert "--reasoning-parser" not in launch_commands("/m", reasoning_parser=None)[0][0]
    with pytest.raises(ValueError, match="num_gpus"):
        launch_commands("/m", num_gpus=0)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        launch_commands("/m", mem_fraction_static=1.5)


def test_launch_commands_name_real_sglang_flags():
    """Every flag we pass exists in the SGLang that ships with Miles (its server_args source)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("no sglang installed (scripts/install_miles_light.sh brings Miles' vendored one)")
    source = (Path(list(spec.submodule_search_locations)[0]) / "srt" / "server_args.py").read_text()
    argv = launch_commands("/m", reasoning_parser="qwen3")[0][0]
    for flag in [a for a in argv if a.startswith("--")]:
        assert f'"{flag}"' in source, flag


async def test_generate_maps_sglang_answers_and_spreads_load(tiny_model_path, stand_in_sglang):
    a = stand_in_sglang(generate_ids=[11, 12, 13], stop_id=2)
    b = stand_in_sglang(generate_ids=[11, 12, 13], stop_id=2)
    a.generate_delay = b.generate_delay = 0.2
    engine = SGLangEngine(tiny_model_path, urls=[a.url, b.url])
    try:
        outs = await asyncio.gather(*(engine.generate([1, 5, 9], max_tokens=8, temperature=0.7, top_k=5, seed=3)
                                      for _ in range(4)))
        assert all(isinstance(o, Completion) for o in outs)
        assert outs[0].token_ids == [11, 12, 13, 2] and outs[0].finish_reason == "stop"
        assert outs[0].logprobs == [logprob_of(i) for i in range(4)] and outs[0].prompt_tokens == 3
        # Concurrent calls went to both servers, not all to one.
        assert a.paths().count("/generate") == 2 and b.paths().count("/generate") == 2
        body = a.calls[0][1]
        assert body["input_ids"] == [1, 5, 9] and body["return_logprob"] is True
        sp = body["sampling_params"]
        assert sp["max_new_tokens"] == 8 and sp["temperature"] == 0.7 and sp["top_k"] == 5
        assert sp["sampling_seed"] == 3 and sp["no_stop_trim"] is True
        assert engine.tokenizer.convert_tokens_to_ids("<|im_end|>") in sp["stop_token_ids"]
        cut = await engine.generate([1], max_tokens=2)
        assert cut.token_ids == [11, 12] and cut.finish_reason == "length"
        with pytest.raises(ValueError):
            await engine.generate([], max_tokens=2)
    finally:
        engine.close()


async def test_weight_push_waits_for_running_calls_and_precedes_the_next_ones(tiny_model_path, stand_in_sglang,
                                                                             tmp_path):
    servers = [stand_in_sglang(generate_ids=[7, 8]) for _ in range(2)]
    for s in servers:
        s.generate_delay = 0.3
    engine = SGLangEngine(tiny_model_path, urls=[s.url for s in servers])
    folder = tmp_path / "step-1"
    folder.mkdir()
    try:
        running = [asyncio.create_task(engine.generate([1, 2], max_tokens=4)) for _ in range(4)]
        await asyncio.sleep(0.1)  # the step's calls are running on the old weights
        update = asyncio.create_task(asyncio.to_thread(engine.update_weights, folder))
        await asyncio.sleep(0.05)
        later = asyncio.create_task(engine.generate([3], max_tokens=4))  # the next step's first call
        old = await asyncio.gather(*running)
        assert await update == 1 and engine.weight_version == 1
        new = await later
        assert [o.weight_version for o in old] == [0, 0, 0, 0] and new.weight_version == 1
        for s in servers:
            paths = s.paths()
            push = paths.index("/update_weights_from_disk")
            body = s.calls[push][1]
            assert body["model_path"] == str(folder) and body["weight_version"] == "1"
            assert body["in_flight"] == 0  # nothing was generating while the weights changed
            assert paths[:push] == ["/generate", "/generate"]  # this step's calls, all before the push
        # The next step's call reached a server only after every server had the new weights.
        after = [(i, s.paths()[s.paths().index("/update_weights_from_disk") + 1:]) for i, s in enumerate(servers)]
        assert sum(p.count("/generate") for _, p in after) == 1
    finally:
        engine.close()


async def test_state_dict_is_saved_as_a_folder_beside_the_config(tiny_model_path, stand_in_sglang):
    server = stand_in_sglang()
    engine = SGLangEngine(tiny_model_path, urls=[server.url])
    try:
        state = {"lm_head.weight": torch.full((2, 3), 0.5)}
        assert await asyncio.to_thread(engine.update_weights, state) == 1
        pushed = server.calls[-1][1]["model_path"]
        assert (Path(pushed) / "config.json").is_file()
        assert torch.equal(load_file(str(Path(pushed) / "model.safetensors"))["lm_head.weight"], state["lm_head.weight"])
        with pytest.raises(FileNotFoundError):
            engine.update_weights("/no/such/folder")
    finally:
        engine.close()
    assert not Path(pushed).exists()  # temporary weights go with the engine


async def test_a_tied_models_state_dict_is_pushed_whole(tiny_model_path, stand_in_sglang):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    state = model.state_dict()  # the learner's push: embeddings and lm_head are one tensor
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    server = stand_in_sglang()
    engine = SGLangEngine(tiny_model_path, urls=[server.url])
    try:
        assert await asyncio.to_thread(engine.update_weights, state) == 1
        saved = load_file(str(Path(server.calls[-1][1]["model_path"]) / "model.safetensors"))
        assert set(saved) == set(state)
        assert torch.equal(saved["lm_head.weight"], state["model.embed_tokens.weight"])
    finally:
        engine.close()


async def test_refused_weights_raise_and_admission_reopens(tiny_model_path, stand_in_sglang, tmp_path):
    server = stand_in_sglang(generate_ids=[4])
    server.fail_update = True
    engine = SGLangEngine(tiny_model_path, urls=[server.url])
    try:
        with pytest.raises(SGLangError, match="refused the weights"):
            await asyncio.to_thread(engine.update_weights, tmp_path)
        assert engine.weight_version == 0
        out = await asyncio.wait_for(engine.generate([1], max_tokens=1), timeout=120)
        assert out.token_ids == [4]
    finally:
        engine.close()


@pytest.mark.slow
def test_launch_failure_reports_the_server_log(tiny_model_path, tmp_path):
    """A server that dies at start (here: no GPU stack on a CPU box) fails fast with its log, not a timeout."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(SGLangError, match="not installed"):
            SGLangEngine(tiny_model_path, num_gpus=1, base_port=39100, launch_timeout=600, log_dir=tmp_path)
        return
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("a full SGLang stack is installed here; this test is for machines without one")
    with pytest.raises(SGLangError, match="exited with"):
        SGLangEngine(tiny_model_path, num_gpus=1, base_port=39100, launch_timeout=600, log_dir=tmp_path)
    assert (tmp_path / "sglang-0.log").read_text()
