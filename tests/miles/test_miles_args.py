"""trainer=miles: the config -> Miles command mapping, its checks, the golden dry run, and clear refusals."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentrl.config.inference import SGLangInferenceConfig, VLLMInferenceConfig
from agentrl.config.trainer import MilesTrainerConfig
from agentrl.plan import Plan, PlanError, build_plan
from agentrl.testing.cli import run_cli
from agentrl.testing.config import compose_config
from agentrl.trainers.miles.args import (
    FIXED_TEMPLATES,
    TEMPLATE_KWARGS,
    MilesConfigError,
    build_launch,
    check_config,
    megatron_model_args,
    roles_key,
)
from agentrl.trainers.miles.launcher import worker_env
from agentrl.trainers.miles.trainer import (
    MilesTrainer,
    MilesUnavailable,
    project_root,
    require_gpus,
    require_miles,
)
from tests.miles.conftest import ctx, flags, make_settings

GOLDEN = Path(__file__).parent / "golden" / "gridsim_miles_dry_run.txt"
# Qwen3-4B's architecture (config.json fields Megatron's flags come from).
QWEN3_4B = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000,
            "rms_norm_eps": 1e-06, "vocab_size": 151936, "tie_word_embeddings": True}

def test_grpo_agentic_and_tracking_flags(tmp_path):
    run = make_settings(prompts_per_step=4, samples_per_prompt=8, global_batch_size=32, steps=20, lr=2e-6,
                   eval_every=5, eval_limit=50, temperature=0.9, max_seq_len=8192, chat_template_path="/t.jinja")
    launch = build_launch(run, ctx(tmp_path), model_args=["--num-layers", "2"])
    f = flags(launch.argv)
    assert f["--rollout-batch-size"] == ["4"] and f["--n-samples-per-prompt"] == ["8"]
    assert f["--global-batch-size"] == ["32"] and f["--num-rollout"] == ["20"] and f["--lr"] == ["2e-06"]
    assert f["--rollout-temperature"] == ["0.9"] and f["--max-seq-len"] == ["8192"]
    assert f["--prompt-data"] == [str(tmp_path / "train.jsonl")]
    assert f["--eval-prompt-data"] == ["reward", f"{tmp_path / 'eval.jsonl'}@[0:50]"]
    assert f["--eval-interval"] == ["5"] and f["--num-layers"] == ["2"]
    assert f["--input-key"] == ["messages"] and f["--metadata-key"] == ["metadata"]
    assert "--apply-chat-template" not in f  # the prompt must stay a message list for the agent
    # Miles' generate and our agent, each behind the wrapper that keeps a failed rollout's reason and reward 0.
    assert f["--custom-generate-function-path"] == ["agentrl.trainers.miles.hooks.generate"]
    assert f["--custom-agent-function-path"] == ["agentrl.trainers.miles.hooks.agent_function"]
    assert launch.env["AGENTRL_AGENT_FUNCTION"] == "agentrl.agents.tool_calling.run"
    assert f["--custom-rm-path"] == ["agentrl.trainers.miles.hooks.reward_func"]
    assert f["--dynamic-sampling-filter-path"] == ["agentrl.trainers.miles.hooks.filter_scored_groups"]
    assert "--use-session-server" in f and f["--tito-model"] == ["qwen3"] and f["--chat-template-path"] == ["/t.jinja"]
    assert f["--sglang-tool-call-parser"] == ["qwen25"] and f["--colocate"] == []
    assert f["--use-mlflow"] == [] and f["--mlflow-run-id"] == ["run123"]
    assert f["--mlflow-tracking-uri"] == ["http://mlflow:5000"] and f["--mlflow-experiment-name"] == ["exp"]
    assert "--use-kl-loss" not in f and "--ref-load" not in f
    assert launch.env["MILES_EXPERIMENTAL_ROLLOUT_REFACTOR"] == "1" and launch.env["MLFLOW_RUN_ID"] == "run123"
    assert launch.command[1:3] == ["-m", "agentrl.trainers.miles.launcher"]
    # The agent, reward hook and filter must be importable by Miles: every path we name resolves here.
    for path in (run.trainer.agent_function, run.trainer.reward_hook, run.trainer.group_filter):
        module, _, name = path.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name))

import importlib  # noqa: E402


def test_batch_sizes_must_match_and_divide():
    with pytest.raises(MilesConfigError, match=r"global_batch_size=30 must equal .* 4 x 8 = 32"):
        check_config(make_settings(global_batch_size=30))
    with pytest.raises(MilesConfigError, match="does not divide over 3 data-parallel ranks"):
        check_config(make_settings(prompts_per_step=2, samples_per_prompt=4, global_batch_size=8, gpus_per_node=3))
    with pytest.raises(MilesConfigError, match="tensor_parallel=3 does not divide the 8 training GPUs"):
        check_config(make_settings(tensor_parallel=3))
    with pytest.raises(MilesConfigError, match="rollout_gpus_per_engine=3 does not divide the 8 rollout GPUs"):
        check_config(make_settings(rollout_gpus_per_engine=3))
    with pytest.raises(ValueError, match="trainer.prompts_per_step must be an integer >= 1, got 0"):
        make_settings(prompts_per_step=0)  # the schema refuses it (config/numbers.py), before any Miles check

def test_kl_needs_a_reference_and_then_uses_it(tmp_path):
    with pytest.raises(MilesConfigError, match="kl_coef=0.01 needs a reference model"):
        check_config(make_settings(kl_coef=0.01))
    f = flags(build_launch(make_settings(kl_coef=0.01, ref_checkpoint="/ref", chat_template_path="/t"), ctx(tmp_path),
                           model_args=[]).argv)
    assert f["--use-kl-loss"] == [] and f["--kl-loss-coef"] == ["0.01"] and f["--ref-load"] == ["/ref"]
    assert f["--kl-loss-type"] == ["low_var_kl"]

def test_backend_parser_and_placement_refusals(tmp_path):
    with pytest.raises(MilesConfigError, match="fsdp is disabled in miles-rl 0.0.2"):
        check_config(make_settings(train_backend="fsdp"))
    check_config(make_settings(train_backend="fsdp", extra_args=["--ci-test"]))  # allowed when asked for knowingly
    with pytest.raises(MilesConfigError, match="train_backend must be one of"):
        check_config(make_settings(train_backend="deepspeed"))
    with pytest.raises(MilesConfigError, match="trainer.tool_call_parser='glm47' but inference.tool_call_parser"):
        check_config(make_settings(tool_call_parser="glm47"))
    run = make_settings(colocate=False, chat_template_path="/t")
    run.inference.num_gpus = 4
    run.inference.urls = ["http://10.0.0.5:30000", "10.0.0.6:30001"]
    f = flags(build_launch(run, ctx(tmp_path), model_args=[]).argv)
    assert f["--rollout-num-gpus"] == ["4"] and "--colocate" not in f
    assert f["--rollout-external"] == [] and f["--rollout-external-engine-addrs"] == ["10.0.0.5:30000",
                                                                                     "10.0.0.6:30001"]
    run.inference.urls = ["http://nohost"]
    with pytest.raises(MilesConfigError, match="needs a host and a port"):
        build_launch(run, ctx(tmp_path), model_args=[])

def test_eval_every_zero_means_before_and_after_training(tmp_path):
    f = flags(build_launch(make_settings(eval_every=0, steps=12, chat_template_path="/t"), ctx(tmp_path), model_args=[]).argv)
    assert f["--eval-interval"] == ["12"] and f["--eval-prompt-data"][1] == str(tmp_path / "eval.jsonl")

def test_token_reaches_workers_but_never_the_report(tmp_path):
    launch = build_launch(make_settings(chat_template_path="/t"), ctx(tmp_path, env_token_var="MY_TOKEN",
                                                                env_token="s3cret"), model_args=[])
    assert launch.env["MY_TOKEN"] == "s3cret" and launch.env["AGENTRL_ENV_TOKEN_VAR"] == "MY_TOKEN"
    assert "s3cret" not in launch.report() and "MY_TOKEN=***" in launch.report()
    forwarded = worker_env({**launch.env, "HOME": "/root", "UNRELATED": "x"}, ("MY_TOKEN",))
    assert forwarded["MY_TOKEN"] == "s3cret" and forwarded["MILES_EXPERIMENTAL_ROLLOUT_REFACTOR"] == "1"
    assert forwarded["PYTHONPATH"] == "/repo" and "HOME" not in forwarded and "UNRELATED" not in forwarded

def test_megatron_architecture_from_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    f = flags(megatron_model_args(tmp_path))
    assert f["--num-layers"] == ["36"] and f["--hidden-size"] == ["2560"] and f["--ffn-hidden-size"] == ["9728"]
    assert f["--num-attention-heads"] == ["32"] and f["--num-query-groups"] == ["8"] and f["--kv-channels"] == ["128"]
    assert f["--rotary-base"] == ["1000000"] and f["--norm-epsilon"] == ["1e-06"] and f["--vocab-size"] == ["151936"]
    assert "--qk-layernorm" in f and "--untie-embeddings-and-output-weights" not in f
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_4B, "model_type": "llama", "tie_word_embeddings": False,
                                                       "num_key_value_heads": 32}))
    f = flags(megatron_model_args(tmp_path))
    assert "--untie-embeddings-and-output-weights" in f and "--qk-layernorm" not in f
    assert "--group-query-attention" not in f
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_4B, "model_type": "deepseek_v3"}))
    with pytest.raises(MilesConfigError, match="no built-in Megatron mapping"):
        megatron_model_args(tmp_path)
    with pytest.raises(MilesConfigError, match="has no config.json"):
        megatron_model_args(tmp_path / "missing")

@pytest.mark.slow
def test_fixed_template_table_agrees_with_miles():
    pytest.importorskip("miles", reason="Miles is not installed: run scripts/install_miles_light.sh")
    from miles.utils.chat_template_utils.tito_tokenizer import TITOTokenizerType, resolve_fixed_chat_template

    for family in TITOTokenizerType:
        if family.value == "default":  # no fixed template: Miles resolves nothing for it
            continue
        path, _ = resolve_fixed_chat_template(family.value, ["tool"])
        assert (Path(path).name if path else None) == FIXED_TEMPLATES.get(family.value), family.value
    # For the families whose template we pass explicitly: the role sets Miles supports and the kwargs it would
    # merge for them are the table's; every other role set is one Miles refuses.
    for family, rows in TEMPLATE_KWARGS.items():
        for roles in (["tool"], ["tool", "user"], ["tool", "system"], ["tool", "user", "system"]):
            if roles_key(roles) in rows:
                path, kwargs = resolve_fixed_chat_template(family, roles)
                assert Path(path).name == FIXED_TEMPLATES[family] and kwargs == rows[roles_key(roles)], (family, roles)
            else:
                with pytest.raises(ValueError, match="No SUPPORTED_TEMPLATES row"):
                    resolve_fixed_chat_template(family, roles)


def test_append_roles_reach_miles_with_the_templates_kwargs(tmp_path):
    f = flags(build_launch(make_settings(append_roles=["tool"]), ctx(tmp_path), model_args=[]).argv)
    assert f["--tito-allowed-append-roles"] == ["tool"] and "--apply-chat-template-kwargs" not in f
    f = flags(build_launch(make_settings(append_roles=["user", "tool"]), ctx(tmp_path), model_args=[]).argv)
    assert f["--tito-allowed-append-roles"] == ["tool", "user"]
    assert json.loads(f["--apply-chat-template-kwargs"][0]) == {"clear_thinking": False}
    # A template of the user's own: its kwargs are the user's business (trainer.extra_args).
    f = flags(build_launch(make_settings(chat_template_path="/t"), ctx(tmp_path), model_args=[]).argv)
    assert f["--chat-template-path"] == ["/t"] and "--apply-chat-template-kwargs" not in f
    with pytest.raises(MilesConfigError, match="tool included"):
        check_config(make_settings(append_roles=["user"]))
    with pytest.raises(MilesConfigError, match="tool included"):
        check_config(make_settings(append_roles=["tool", "assistant"]))
    with pytest.raises(MilesConfigError, match=r"fixed qwen3 template supports only \[\['tool'\], \['tool', 'user'\]\]"):
        check_config(make_settings(append_roles=["tool", "system"]))
    check_config(make_settings(append_roles=["tool", "system"], chat_template_path="/t"))


def test_fit_refuses_without_miles_or_gpus(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "miles" else real(n, *a))
    with pytest.raises(MilesUnavailable, match="missing miles"):
        require_miles()
    monkeypatch.undo()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    with pytest.raises(MilesUnavailable, match=r"needs 8 GPU\(s\) on this machine .* and found 0"):
        require_gpus(make_settings())
    with pytest.raises(MilesUnavailable, match="num_nodes=2 needs a Ray cluster"):
        require_gpus(make_settings(num_nodes=2))
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    require_gpus(make_settings(num_nodes=2))  # the launcher checks the cluster's GPUs

def normalize(text: str, home: Path, model: Path) -> str:
    spec = importlib.util.find_spec("miles_tito_tokenizers")
    templates = str(Path(list(spec.submodule_search_locations)[0]) / "templates")
    # The interpreter first: in a venv inside the checkout (scripts/test.sh's .venv) its path starts with the repo's.
    for old, new in ((sys.executable, "<python>"), (templates, "<miles_tito_tokenizers>/templates"),
                     (str(model), "<model>"), (str(home), "<home>"), (project_root(), "<repo>")):
        text = text.replace(old, new)
    return re.sub(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", "<time>", text)

@pytest.mark.slow
def test_golden_dry_run_of_gridsim_miles(agentrl_home: Path, tmp_path: Path):
    if importlib.util.find_spec("miles_tito_tokenizers") is None:
        pytest.skip("miles-tito-tokenizers is not installed: run scripts/install_miles_light.sh")
    model = tmp_path / "Qwen3-4B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_4B))
    proc = run_cli(["+recipe=gridsim_miles", "dry_run=true", f"model.path={model}"], cwd=tmp_path,
                   env={"PYTHONPATH": "", "RAY_ADDRESS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.stdout[proc.stdout.index("miles: env server"):proc.stdout.index("dry run: composed")]
    got = normalize(report, agentrl_home, model)
    if os.environ.get("AGENTRL_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text()

@pytest.mark.slow
def test_dry_run_refuses_bad_batch_sizes_before_anything_starts(agentrl_home: Path, tmp_path: Path):
    proc = run_cli(["+recipe=gridsim_miles", "dry_run=true", "trainer.global_batch_size=30"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "agentrl: trainer.global_batch_size=30 must equal prompts_per_step x samples_per_prompt" in proc.stderr
    assert "Traceback" not in proc.stderr

def _miles_plan(tmp_path: Path, *overrides: str) -> Plan:
    cfg = compose_config("+recipe=gridsim_miles", f"paths.output_root={tmp_path}", *overrides)
    return build_plan(cfg, choices={"trainer": "miles"}, run_dir=tmp_path / "run")


def test_the_plan_refuses_what_miles_cannot_run(tmp_path):
    with pytest.raises(PlanError, match=r"trainer.global_batch_size=30 must equal .* 4 x 8 = 32"):
        _miles_plan(tmp_path, "trainer.global_batch_size=30")
    with pytest.raises(PlanError, match="kl_coef=0.1 needs a reference model"):
        _miles_plan(tmp_path, "trainer.kl_coef=0.1")


def test_trainer_construction_checks_the_plans_settings(tmp_path):
    plan = _miles_plan(tmp_path)
    plan.settings.trainer.kl_coef = 0.1  # past the plan's own check, as a plan built by hand could be
    with pytest.raises(SystemExit, match="kl_coef=0.1 needs a reference model"):
        MilesTrainer(plan=plan, tracker=None)
    trainer = MilesTrainer(plan=_miles_plan(tmp_path, "trainer.save_dir=/ckpt"), tracker=None)
    assert not hasattr(trainer, "cfg")  # the plan's typed settings are all it reads
    assert isinstance(trainer.settings.trainer, MilesTrainerConfig)
    assert MilesTrainer.save_dir(trainer.settings.trainer, tmp_path) == Path("/ckpt")


def test_the_env_server_miles_serves_takes_env_server_and_sandbox_settings(tmp_path):
    plan = _miles_plan(tmp_path, "env.server.max_concurrent_envs=3", "env.server.tool_timeout=7",
                       "env.server.reset_timeout=9", "env.server.session_idle_timeout=11")
    app = MilesTrainer(plan=plan, tracker=None).env_app(token="t")
    served, sessions = app.state.served, app.state.sessions
    assert (served.tool_timeout, served.reset_timeout) == (7.0, 9.0)
    assert (sessions.max_sessions, sessions.idle_timeout) == (3, 11.0)
    assert served.bundle is plan.bundle


def test_the_launch_refuses_an_untyped_config():
    """A DictConfig would answer the same attribute reads: the launch says to pass plan.settings instead."""
    with pytest.raises(TypeError, match="pass plan.settings"):
        check_config(OmegaConf.structured(make_settings()))


def test_only_an_sglang_inference_group_feeds_miles_sglang(tmp_path):
    run = make_settings(chat_template_path="/t")
    run.inference = VLLMInferenceConfig()  # its knobs mean nothing to the SGLang engines Miles launches
    with pytest.raises(MilesConfigError, match=r"no tool-call parser: set trainer.tool_call_parser \(or choose "
                                               r"inference=sglang\)"):
        check_config(run)
    run.trainer.tool_call_parser = "qwen25"
    f = flags(build_launch(run, ctx(tmp_path), model_args=[]).argv)
    assert f["--sglang-tool-call-parser"] == ["qwen25"]
    assert f["--sglang-mem-fraction-static"] == [str(SGLangInferenceConfig.mem_fraction_static)]
    run.inference.urls = ["http://10.0.0.5:8000"]
    with pytest.raises(MilesConfigError, match=r"inference.urls names vLLM servers .* choose inference=sglang"):
        check_config(run)
