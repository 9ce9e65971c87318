"""Miles' own agentic rollout, on a CPU, against our env server (real, loopback) and a stand-in SGLang.

What runs for real: our rows writer, Miles' RolloutDataSource reading those rows, Miles' rollout loop
(`generate_rollout_async`: groups, the dynamic filter, drop metrics, abort of leftovers), Miles'
`agentic_tool_call.generate` and its session server (TITO token bookkeeping, loss masks), our
tool-calling agent function, our reward hook and group filter, and our env server. Only SGLang is a
stand-in (it needs a GPU): it returns scripted replies with token ids and logprobs in Miles' shape.

Script, per echo task: task 0 calls `echo` then answers correctly (reward 1); task 1 calls `echo` but
its reply is cut at max tokens (the agent flags it: the group must be dropped as agentenv_failed);
task 2 answers wrongly at once (reward 0, a valid group that must be kept).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re

import pytest

pytest.importorskip("miles", reason="Miles is not installed: run scripts/install_miles_light.sh")
pytest.importorskip("ray", reason="Miles' light dependencies are missing: run scripts/install_miles_light.sh")

from miles.rollout.inference_rollout.inference_rollout_common import GenerateState  # noqa: E402
from miles.rollout.inference_rollout.inference_rollout_train import generate_rollout_async  # noqa: E402
from miles.rollout.session.session_server import SessionServer  # noqa: E402
from miles.utils import http_utils  # noqa: E402
from miles.utils.types import Sample  # noqa: E402

from agentrl.envs.server import build_app, serve_in_background  # noqa: E402
from agentrl.envs.server.echo import EchoBundle  # noqa: E402
from agentrl.rows import write_rows  # noqa: E402
from agentrl.testing.ports import free_port  # noqa: E402
from agentrl.trainers.miles import hooks as miles_hooks  # noqa: E402
from agentrl.trainers.miles.args import AGENT_FUNCTION, GENERATE_FUNCTION, REFACTOR_ENV  # noqa: E402
from agentrl.trainers.miles.hooks import FAILED_REASON, filter_scored_groups, reward_func  # noqa: E402
from tests.miles.conftest import logprob_of, tool_call  # noqa: E402

pytestmark = pytest.mark.slow

TASK = re.compile(r"reply (answer-(\w+)-(\d+))\.")


def policy(messages: list[dict]) -> dict:
    """The scripted model (see the module docstring)."""
    user = next(m["content"] for m in messages if m["role"] == "user")
    answer, _, index = TASK.search(user).groups()
    index = int(index)
    called = any(m["role"] == "tool" for m in messages)
    if index == 2:
        return {"content": "answer-wrong"}
    if not called:
        return {"tool_calls": [tool_call("echo", {"text": "ping"}, "call_1")],
                "finish_reason": "length" if index == 1 else None}
    return {"content": answer}


def miles_args(model: str, rows: dict, sglang_url: str, session_port: int, roles: tuple[str, ...] = ("tool",),
               template_kwargs: dict | None = None) -> argparse.Namespace:
    """The subset of Miles' parsed arguments this path reads (parse_args itself needs the GPU stack)."""
    host, port = sglang_url.removeprefix("http://").split(":")
    return argparse.Namespace(
        hf_checkpoint=model, chat_template_path=None, apply_chat_template=False, apply_chat_template_kwargs=template_kwargs or {},
        prompt_data=str(rows["train"]), input_key="messages", metadata_key="metadata", label_key=None,
        tool_key="tools", multimodal_keys=None, rollout_max_prompt_len=None, rollout_seed=0, rollout_shuffle=False,
        rollout_global_dataset=True, dump_details=None, n_samples_per_prompt=2, rollout_batch_size=2,
        over_sampling_batch_size=2, rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1,
        rollout_max_response_len=64, rollout_stop=None, rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False, sglang_server_concurrency=8, rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1, sglang_router_ip=host, sglang_router_port=int(port),
        custom_generate_function_path=GENERATE_FUNCTION, custom_agent_function_path=AGENT_FUNCTION,
        custom_rm_path="agentrl.trainers.miles.hooks.reward_func",
        dynamic_sampling_filter_path="agentrl.trainers.miles.hooks.filter_scored_groups",
        eval_max_prompt_len=None, eval_reward_key=None,
        generate_multi_samples=False, use_session_server=True, session_server_ip="127.0.0.1",
        session_server_port=session_port, tito_model="qwen3", tito_allowed_append_roles=sorted(roles),
        use_rollout_routing_replay=False, miles_router_timeout=None, group_rm=False, partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False, rm_type=None, reward_key=None, rollout_sample_filter_path=None,
        rollout_all_samples_process_path=None, recompute_logprobs_via_prefill=False, dumper_enable=False, dumper_inference=[],
        sglang_enable_deterministic_inference=False, ci_test=False, use_miles_router=False,
    )


@contextlib.contextmanager
def running_world(tmp_path, tiny_model_path, stand_in_sglang, bundle, scripted, **args_kw):
    """Env server (serving `bundle`) + rows + stand-in SGLang (playing `scripted`) + Miles' session server."""
    with serve_in_background(build_app(bundle, max_concurrent_envs=8)) as env_url:
        rows = write_rows(env_url, tmp_path / "rows", max_turns=3, tool_timeout=10)
        from transformers import AutoTokenizer

        sglang = stand_in_sglang(tokenizer=AutoTokenizer.from_pretrained(tiny_model_path), policy=scripted)
        port = free_port()
        args = miles_args(tiny_model_path, rows, sglang.url, port, **args_kw)
        session = SessionServer(args, sglang.url)
        from agentrl.envs.server import start_server_in_thread

        _, stop = start_server_in_thread(session.app, "127.0.0.1", port)
        try:
            yield args, sglang, rows
        finally:
            stop()


@pytest.fixture
def world(tmp_path, tiny_model_path, stand_in_sglang, monkeypatch):
    """Env server + rows + stand-in SGLang + Miles' session server, all on loopback."""
    monkeypatch.setenv(REFACTOR_ENV, "1")
    # Tasks 0 and 2 score the same for both samples: kept here, to follow whole groups through Miles' loop.
    monkeypatch.setenv(miles_hooks.DROP_NO_SIGNAL_ENV, "0")
    with running_world(tmp_path, tiny_model_path, stand_in_sglang, EchoBundle(train=3, eval=1), policy) as w:
        yield w


async def test_miles_rollout_keeps_scored_groups_and_counts_agentenv_failures(world, monkeypatch):
    import httpx

    args, sglang, _ = world
    # Miles' module-level client (init_http_client in a real run), bound to this test's event loop.
    monkeypatch.setattr(http_utils, "_http_client", httpx.AsyncClient(trust_env=False, timeout=300))
    from miles.rollout.data_source import RolloutDataSource

    data_source = RolloutDataSource(args)
    state = GenerateState(args)
    assert state.generate_function is miles_hooks.generate
    output, _ = await generate_rollout_async(state, 0, data_source.get_samples)

    # Group of task 1 dropped (flagged by the agent), counted under our reason; tasks 0 and 2 kept.
    assert output.metrics == {f"rollout/dynamic_filter/drop_{FAILED_REASON}": 1}
    groups = output.samples
    assert [g[0].metadata["index"] for g in groups] == [0, 2]
    assert all(len(g) == 2 for g in groups)
    right, wrong = groups[0][0], groups[1][0]

    # Our reward travelled: env server -> agent's returned dict -> sample metadata -> our reward hook.
    assert right.metadata["reward"] == 1.0 and right.reward == 1.0
    assert wrong.metadata["reward"] == 0.0 and wrong.reward == 0.0
    assert "agentenv_failure" not in right.metadata
    assert right.metadata["agentenv_tool_calls"] == 1 and right.metadata["agentenv_scores"] == {"match": 1.0}
    assert await reward_func(args, right) == 1.0
    assert await reward_func(args, [right, wrong]) == [1.0, 0.0]
    assert right.status == Sample.Status.COMPLETED
    assert right.metadata.get("tito_session_mismatch") == []

    # Loss mask: the two model turns are 1, the tool response and the next generation prompt are 0.
    tokenizer = state.tokenizer
    mask, logprobs = right.loss_mask, right.rollout_log_probs
    assert len(mask) == right.response_length == len(logprobs)
    response_ids = right.tokens[-right.response_length:]
    runs = _runs(mask)
    assert [v for v, _, _ in runs] == [1, 0, 1]
    masked_text = tokenizer.decode([response_ids[i] for i in range(runs[1][1], runs[1][2])])
    assert "<tool_response>\nping\n</tool_response>" in masked_text and masked_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    first = tokenizer.decode(response_ids[: runs[0][2]])
    assert first.startswith("<tool_call>") and first.endswith("<|im_end|>")
    last = tokenizer.decode(response_ids[runs[2][1]:])
    assert last == "answer-train-0<|im_end|>"
    # Sampling logprobs where the model produced tokens, 0.0 where it did not.
    assert logprobs[: runs[0][2]] == [logprob_of(i) for i in range(runs[0][2])]
    assert all(lp == 0.0 for lp in logprobs[runs[1][1]:runs[1][2]])
    assert right.weight_versions == ["0", "0"]

    # The router's abort ran for the leftover group; every backend call carried Miles' input_ids.
    assert ("/abort_request", {"abort_all": True}) in sglang.calls
    chats = [b for p, b in sglang.calls if p == "/v1/chat/completions"]
    assert chats and all(b.get("input_ids") for b in chats)


def test_filter_on_the_real_group_shapes():
    """The same filter on Miles' Sample objects: a flagged or reward-less sample drops its group, counted."""
    ok = Sample(metadata={"reward": 1.0}, reward=1.0, status=Sample.Status.COMPLETED)
    flagged = Sample(metadata={"reward": 0.0, "agentenv_failure": "truncated"}, reward=0.0,
                     status=Sample.Status.TRUNCATED)
    aborted = Sample(metadata={}, reward=None, status=Sample.Status.ABORTED)
    from miles.rollout.filter_hub.base_types import DynamicFilterOutput, MetricGatherer, call_dynamic_filter

    gatherer = MetricGatherer()
    wrong = Sample(metadata={"reward": 0.0}, reward=0.0, status=Sample.Status.COMPLETED)
    outs = [call_dynamic_filter(filter_scored_groups, None, g) for g in ([ok, wrong], [ok, flagged], [aborted, ok],
                                                                          [[ok], [ok, flagged]], [ok, ok])]
    assert all(isinstance(o, DynamicFilterOutput) for o in outs)
    assert [o.keep for o in outs] == [True, False, False, False, False]
    for o in outs:
        if not o.keep:
            gatherer.on_dynamic_filter_drop(reason=o.reason)
    # Every drop counted by its reason, as the built-in trainer counts rollout/groups_dropped/<reason>.
    assert gatherer.collect() == {"rollout/dynamic_filter/drop_agentenv_failed": 3,
                                  "rollout/dynamic_filter/drop_no_signal": 1}


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def answer_every_turn(messages: list[dict]) -> dict:
    """A model that ends each turn with the reply the latest user turn asks for."""
    user = [m["content"] for m in messages if m["role"] == "user"][-1]
    return {"content": TASK.search(user).group(1)}


@pytest.fixture
def multi_turn_world(request, tmp_path, tiny_model_path, stand_in_sglang, monkeypatch):
    """A two-turn echo task; Miles' session server set up as `trainer=miles` launches it (the default config,
    or the trainer settings `request.param` gives)."""
    import json

    from agentrl.trainers.miles.args import build_launch
    from agentrl.trainers.miles.hooks import MAX_DROPS_ENV
    from tests.miles.conftest import ctx, flags, make_settings

    monkeypatch.setenv(REFACTOR_ENV, "1")
    monkeypatch.setenv(miles_hooks.DROP_NO_SIGNAL_ENV, "0")  # both samples of a group score the same here
    launch = build_launch(make_settings(**getattr(request, "param", {})), ctx(tmp_path / "launch"), model_args=[])
    monkeypatch.setenv(MAX_DROPS_ENV, launch.env[MAX_DROPS_ENV])  # as the launcher's Ray workers get it
    f = flags(launch.argv)
    roles = tuple(f["--tito-allowed-append-roles"])
    kwargs = json.loads(f["--apply-chat-template-kwargs"][0]) if "--apply-chat-template-kwargs" in f else {}
    with running_world(tmp_path, tiny_model_path, stand_in_sglang, EchoBundle(train=2, eval=1, turns=2),
                       answer_every_turn, roles=roles, template_kwargs=kwargs) as (args, sglang, _):
        yield args, sglang


@pytest.mark.parametrize("multi_turn_world", [{"append_roles": ["tool"], "max_drops_in_a_row": 3}], indirect=True)
async def test_a_run_whose_every_group_fails_stops_with_the_reason(multi_turn_world, monkeypatch):
    """With tool appends only, every two-turn episode is refused at its user turn: instead of Miles drawing
    groups forever, the group filter stops the rollout after max_drops_in_a_row drops, saying why."""
    import httpx
    from miles.rollout.data_source import RolloutDataSource

    from agentrl import group_filter

    monkeypatch.setattr(miles_hooks._streak, "in_a_row", 0)
    args, sglang = multi_turn_world
    assert args.tito_allowed_append_roles == ["tool"]
    monkeypatch.setattr(http_utils, "_http_client", httpx.AsyncClient(trust_env=False, timeout=300))
    args.rollout_batch_size = args.over_sampling_batch_size = 1
    state = GenerateState(args)
    with pytest.raises(group_filter.AllGroupsFailing, match=r"4 groups in a row were dropped as agentenv_failed"):
        await asyncio.wait_for(generate_rollout_async(state, 0, RolloutDataSource(args).get_samples), 600)


async def test_multi_turn_task_appends_user_turns_under_the_default_roles(multi_turn_world, monkeypatch):
    """A two-turn task appends the env's next prompt as a user turn. Miles' session server takes it only when
    --tito-allowed-append-roles names user (its own default is tool alone: a 400 that flags the episode, and
    Miles' loop would then draw groups forever); trainer.append_roles' default does, with the fixed qwen3
    template's kwargs."""
    import httpx
    from miles.rollout.data_source import RolloutDataSource

    args, sglang = multi_turn_world
    assert args.tito_allowed_append_roles == ["tool", "user"]
    monkeypatch.setattr(http_utils, "_http_client", httpx.AsyncClient(trust_env=False, timeout=300))
    args.rollout_batch_size = args.over_sampling_batch_size = 1
    state = GenerateState(args)
    output, _ = await asyncio.wait_for(generate_rollout_async(state, 0, RolloutDataSource(args).get_samples), 600)
    assert output.metrics == {}
    (group,) = output.samples
    for sample in group:
        assert sample.reward == 1.0 and "agentenv_failure" not in sample.metadata
        assert [v for v, _, _ in _runs(sample.loss_mask)] == [1, 0, 1]  # both replies trained, the user turn not
        assert sample.metadata.get("tito_session_mismatch") == []
    chats = [b for p, b in sglang.calls if p == "/v1/chat/completions"]
    assert len(chats) == 4  # two turns for each of the group's two samples
    assert sorted(len([m for m in b["messages"] if m["role"] == "user"]) for b in chats) == [1, 1, 2, 2]


async def test_miles_eval_scores_a_rollout_that_failed_before_the_model_zero(world, monkeypatch, tmp_path):
    """With the env server gone, every eval episode fails before the model is called: Miles' generate returns
    the input sample aborted and skips the reward hook. Through Miles' real eval path each such sample must
    carry reward 0 and its failure reason, where a None reward used to crash eval's logging."""
    import json

    import httpx
    from miles.rollout.inference_rollout.inference_rollout_eval import eval_rollout_single_dataset
    from miles.utils.eval_config import EvalDatasetConfig

    args, sglang, rows = world
    monkeypatch.setattr(http_utils, "_http_client", httpx.AsyncClient(trust_env=False, timeout=300))
    dead = f"http://127.0.0.1:{free_port()}"  # a port where nothing listens: the env server was stopped
    eval_rows = tmp_path / "eval-dead.jsonl"
    with open(rows["eval"]) as src, open(eval_rows, "w") as out:
        for line in src:
            row = json.loads(line)
            row["metadata"].update(url=dead, connect_timeout=0.5)
            out.write(json.dumps(row) + "\n")
    config = EvalDatasetConfig(name="reward", path=str(eval_rows), input_key="messages", metadata_key="metadata",
                               tool_key="tools", n_samples_per_eval_prompt=2, temperature=1.0, top_p=1.0,
                               top_k=-1, max_response_len=64)
    result = await asyncio.wait_for(eval_rollout_single_dataset(GenerateState(args), config, {}), 600)
    rewards = result["reward"]["rewards"]
    assert rewards == [0.0, 0.0] and sum(rewards) == 0.0  # eval's own sum no longer meets a None
    for sample in result["reward"]["samples"]:
        assert sample.metadata["agentenv_failure"] == "env_unreachable"
        assert dead.removeprefix("http://") in sample.metadata["agentenv_error"]
    assert not [c for c in sglang.calls if c[0] == "/v1/chat/completions"]  # the model was never called
