"""A `trainer=miles` run's typed settings (`Plan.settings`) as Miles' command line and environment.

Pure functions: nothing here imports Miles, starts a process or touches a GPU, so a dry run prints
exactly what `fit()` would launch, on any machine.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agentrl.config.algorithm import miles_algorithm_problem
from agentrl.config.inference import SGLangInferenceConfig, VLLMInferenceConfig
from agentrl.config.schema import RunConfig
from agentrl.config.trainer import MilesTrainerConfig
from agentrl.trainers.common.resume import resume_mode
from agentrl.trainers.miles.hooks import AGENT_FUNCTION_ENV, DROP_NO_SIGNAL_ENV, MAX_DROPS_ENV
from agentrl.trainers.miles.lora_flags import lora_args, lora_problem
from agentrl.trainers.miles.rubric import launch_reward

LAUNCHER_MODULE = "agentrl.trainers.miles.launcher"
# Miles' agentic generate and the agent function, each wrapped so a rollout that fails before the model's first
# call still carries reward 0 and its failure (Miles drops both otherwise, and its eval crashes on the None).
GENERATE_FUNCTION = "agentrl.trainers.miles.hooks.generate"
AGENT_FUNCTION = "agentrl.trainers.miles.hooks.agent_function"
# Miles 0.0.2 registers --custom-agent-function-path (and the new rollout path) only under this flag.
REFACTOR_ENV = "MILES_EXPERIMENTAL_ROLLOUT_REFACTOR"
# The name under which Miles' eval mean reward is logged is `eval/<dataset name>`: naming the eval
# dataset "reward" makes it `eval/reward`, the objective every agentrl trainer reports.
EVAL_DATASET_NAME = "reward"
# Families whose fixed (prefix-stable) chat template Miles' wheel forgets to ship; the same files are in
# the miles-tito-tokenizers package. Tests check this table against Miles' resolver.
FIXED_TEMPLATES = {
    "qwen3": "qwen3_fixed.jinja",
    "qwen35": "qwen3.5_fixed.jinja",
    "qwennext": "qwen3_thinking_2507_and_next_fixed.jinja",
    "kimi25": "kimi_k25_fixed.jinja",
}
# The role sets each of those templates supports, with the kwargs Miles' resolver would merge into
# --apply-chat-template-kwargs for them: it skips that merge once --chat-template-path is explicit, which the
# missing templates force on us. Keys are the sorted roles joined by commas.
TEMPLATE_KWARGS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen3": {"tool": {}, "tool,user": {"clear_thinking": False}},
    "qwen35": {"tool": {}, "tool,user": {"clear_thinking": False}},
    "qwennext": {"tool": {}, "tool,user": {"clear_thinking": False}},
    "kimi25": {"tool": {"preserve_thinking": True}, "tool,user": {"preserve_thinking": True}},
}
APPEND_ROLES = ("tool", "user", "system")
TEMPLATES_PACKAGE = "miles_tito_tokenizers"
BACKENDS = ("megatron", "fsdp")


def roles_key(roles: Any) -> str:
    """`trainer.append_roles` as TEMPLATE_KWARGS keys them: sorted, deduplicated, comma-joined."""
    return ",".join(sorted({str(r) for r in roles}))


class MilesConfigError(ValueError):
    """The trainer=miles config cannot make a valid Miles run."""


@dataclass
class LaunchContext:
    """What the run supplies besides its config: data, tracking and where things go."""

    rows: dict[str, Path]  # split -> rows file (the rows writer's output)
    save_dir: Path
    tracking_uri: str
    experiment: str
    run_id: str
    env_token_var: str | None = None  # name of the variable holding the env server's token
    env_token: str | None = None  # its value, passed to Ray workers but never printed
    pythonpath: str = ""
    # A dry run prints the command even where Miles' packages are missing: placeholders stand for their files.
    dry_run: bool = False


@dataclass
class MilesLaunch:
    """The launcher command and its environment (also handed to every Ray worker)."""

    argv: list[str]  # Miles' own arguments
    env: dict[str, str]
    secret_env: set[str] = field(default_factory=set)
    python: str = sys.executable

    @property
    def command(self) -> list[str]:
        return [self.python, "-m", LAUNCHER_MODULE, *self.argv]

    def report(self) -> str:
        """The environment and command as a shell would run them; secrets show as `***`."""
        env = [f"{k}={'***' if k in self.secret_env else shlex.quote(v)}" for k, v in sorted(self.env.items())]
        lines = ["miles environment (also given to every Ray worker):", *(f"  {e}" for e in env),
                 "miles command:", "  " + shlex.quote(self.command[0]) + " " + " ".join(self.command[1:3])]
        argv, i = self.argv, 0
        while i < len(argv):  # one flag and its values per line
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            lines.append("    " + " ".join(shlex.quote(a) for a in argv[i:j]))
            i = j
        return "\n".join(lines)


def sglang_settings(settings: RunConfig) -> SGLangInferenceConfig | None:
    """The `inference` group when it is SGLang's (inference=sglang), else None: Miles launches SGLang itself and
    takes its parsers, GPUs, external engines and memory share from there; another engine's settings mean nothing
    to it."""
    inference = settings.inference
    return inference if isinstance(inference, SGLangInferenceConfig) else None


def miles_settings(settings: RunConfig) -> MilesTrainerConfig:
    """`settings.trainer`, which must be trainer=miles' typed schema (the plan's `settings`, not a DictConfig)."""
    if not isinstance(settings.trainer, MilesTrainerConfig):
        raise TypeError(f"trainer=miles reads the plan's typed settings (trainer a MilesTrainerConfig), got "
                        f"trainer as {type(settings.trainer).__name__}: pass plan.settings")
    return settings.trainer


def tool_call_parser(settings: RunConfig) -> str:
    """trainer.tool_call_parser, else inference.tool_call_parser; both set and different is an error."""
    sglang = sglang_settings(settings)
    mine, engine = miles_settings(settings).tool_call_parser, sglang.tool_call_parser if sglang else None
    if mine and engine and mine != engine:
        raise MilesConfigError(
            f"trainer.tool_call_parser={mine!r} but inference.tool_call_parser={engine!r}: set one of them")
    parser = mine or engine
    if not parser:
        where = "inference.tool_call_parser" if sglang else "trainer.tool_call_parser (or choose inference=sglang)"
        raise MilesConfigError(f"no tool-call parser: set {where} (qwen25 for Qwen3)")
    return parser


def check_config(settings: RunConfig) -> None:
    """Every check that needs no GPU and no Miles: batch sizes, KL, placement, backend, algorithm keys."""
    t = miles_settings(settings)
    if problem := miles_algorithm_problem(t):  # also the schema's own check, so it fails when the plan is built
        raise MilesConfigError(problem)
    if settings.env.server.process:
        raise MilesConfigError("env.server.process=true is not applied under trainer=miles: Miles' learner and "
                               "engines run in processes of their own, and the env server it starts runs beside "
                               "its launcher; leave it false")
    # counts (>= 1) and rates are the schema's (config/numbers.py): refused when the settings were built
    if t.prompts_per_step * t.samples_per_prompt != t.global_batch_size:
        raise MilesConfigError(
            f"trainer.global_batch_size={t.global_batch_size} must equal prompts_per_step x samples_per_prompt "
            f"= {t.prompts_per_step} x {t.samples_per_prompt} = {t.prompts_per_step * t.samples_per_prompt} "
            "(one optimizer step per rollout step)")
    train_gpus = t.num_nodes * t.gpus_per_node
    if train_gpus % t.tensor_parallel:
        raise MilesConfigError(
            f"trainer.tensor_parallel={t.tensor_parallel} does not divide the {train_gpus} training GPUs")
    dp = train_gpus // t.tensor_parallel
    if t.global_batch_size % dp:
        raise MilesConfigError(
            f"trainer.global_batch_size={t.global_batch_size} does not divide over {dp} data-parallel ranks "
            f"({train_gpus} GPUs / tensor_parallel {t.tensor_parallel})")
    rollout = rollout_gpus(settings)
    if rollout % t.rollout_gpus_per_engine:
        raise MilesConfigError(
            f"trainer.rollout_gpus_per_engine={t.rollout_gpus_per_engine} does not divide the {rollout} "
            "rollout GPUs")
    if t.kl_coef < 0:
        raise MilesConfigError(f"trainer.kl_coef must be >= 0, got {t.kl_coef}")
    if t.kl_coef > 0 and not t.ref_checkpoint:
        raise MilesConfigError(
            f"trainer.kl_coef={t.kl_coef} needs a reference model: set trainer.ref_checkpoint "
            "(Miles' --ref-load; an HF folder in bridge mode, a Megatron torch_dist folder otherwise)")
    if t.train_backend not in BACKENDS:
        raise MilesConfigError(f"trainer.train_backend must be one of {BACKENDS}, got {t.train_backend!r}")
    if t.train_backend == "fsdp" and "--ci-test" not in list(t.extra_args):
        raise MilesConfigError(
            "trainer.train_backend=fsdp is disabled in miles-rl 0.0.2 (it refuses to run without --ci-test, "
            "which also turns on CI assertions); use train_backend=megatron, or add '--ci-test' to "
            "trainer.extra_args knowingly")
    roles = [str(r) for r in t.append_roles]
    if "tool" not in roles or set(roles) - set(APPEND_ROLES):
        raise MilesConfigError(
            f"trainer.append_roles={roles}: name roles among {list(APPEND_ROLES)}, tool included (every agent "
            "appends tool results)")
    supported = TEMPLATE_KWARGS.get(t.tito_model, {})
    if supported and not t.chat_template_path and roles_key(roles) not in supported:
        raise MilesConfigError(
            f"trainer.append_roles={roles}: the fixed {t.tito_model} template supports only "
            f"{[k.split(',') for k in supported]} (or give trainer.chat_template_path)")
    if t.megatron_to_hf_mode not in ("bridge", "raw"):
        raise MilesConfigError(f"trainer.megatron_to_hf_mode must be bridge or raw, got {t.megatron_to_hf_mode!r}")
    if isinstance(settings.inference, VLLMInferenceConfig) and settings.inference.urls:
        # vLLM servers are not SGLang engines Miles could drive (--rollout-external).
        raise MilesConfigError("inference.urls names vLLM servers (inference=vllm); trainer=miles drives SGLang "
                               "engines only: choose inference=sglang with inference.urls=[...] (or drop the urls)")
    tool_call_parser(settings)
    if problem := lora_problem(settings):
        raise MilesConfigError(problem)


def rollout_gpus(settings: RunConfig) -> int:
    """GPUs SGLang gets: all the training GPUs when colocated, else trainer.rollout_gpus or inference.num_gpus."""
    t, sglang = miles_settings(settings), sglang_settings(settings)
    if t.colocate:
        return t.num_nodes * t.gpus_per_node
    n = t.rollout_gpus or (sglang.num_gpus if sglang else 0)
    if n < 1:
        raise MilesConfigError("trainer.colocate=false needs trainer.rollout_gpus (or inference.num_gpus) >= 1")
    return n


def fixed_chat_template(tito_model: str, *, missing_ok: bool = False) -> str | None:
    """The path of `tito_model`'s fixed chat template in miles-tito-tokenizers, None when it needs none.

    Raises MilesConfigError when the family needs one and the package is not installed; with `missing_ok`
    (a dry run) returns a `<miles_tito_tokenizers>/templates/NAME` placeholder instead.
    """
    name = FIXED_TEMPLATES.get(tito_model)
    if name is None:
        return None
    spec = importlib.util.find_spec(TEMPLATES_PACKAGE)  # locating does not import it (tiktoken stays out)
    if spec is None or not spec.submodule_search_locations:
        if missing_ok:
            return f"<{TEMPLATES_PACKAGE}>/templates/{name}"
        raise MilesConfigError(
            f"--tito-model {tito_model} needs {name}, which miles-rl 0.0.2 does not ship: "
            "`pip install --no-deps miles-tito-tokenizers==0.1.1` (or set trainer.chat_template_path)")
    path = Path(list(spec.submodule_search_locations)[0]) / "templates" / name
    if not path.is_file():
        raise MilesConfigError(f"{TEMPLATES_PACKAGE} is installed but has no templates/{name}")
    return str(path)


def megatron_model_args(model_path: str | Path) -> list[str]:
    """Megatron's architecture flags for a dense Qwen3 / Qwen2 / Llama Hugging Face folder (its config.json)."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        raise MilesConfigError(f"model.path {model_path} has no config.json (Megatron needs the architecture)")
    hf = json.loads(config_file.read_text())
    kind = hf.get("model_type")
    if kind not in ("qwen3", "qwen2", "llama"):
        raise MilesConfigError(
            f"{config_file}: model_type {kind!r} has no built-in Megatron mapping (dense qwen3, qwen2, llama); "
            "pass the architecture flags in trainer.extra_args")
    heads = int(hf["num_attention_heads"])
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    rope = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta") or 10000
    args = ["--num-layers", str(hf["num_hidden_layers"]), "--hidden-size", str(hf["hidden_size"]),
            "--ffn-hidden-size", str(hf["intermediate_size"]), "--num-attention-heads", str(heads)]
    if kv_heads != heads:
        args += ["--group-query-attention", "--num-query-groups", str(kv_heads)]
    args += ["--kv-channels", str(head_dim), "--use-rotary-position-embeddings", "--rotary-base", _num(rope),
             "--disable-bias-linear", "--normalization", "RMSNorm", "--norm-epsilon", _num(hf.get("rms_norm_eps", 1e-6)),
             "--swiglu", "--vocab-size", str(hf["vocab_size"])]
    if kind == "qwen3":
        args.append("--qk-layernorm")
    if kind == "qwen2":
        args.append("--add-qkv-bias")
    if not hf.get("tie_word_embeddings", False):
        args.append("--untie-embeddings-and-output-weights")
    return args


def _num(x: Any) -> str:
    f = float(x)
    return str(int(f)) if f.is_integer() else repr(f)


def _host_port(url: str) -> str:
    parsed = urlparse(url if "//" in url else f"http://{url}")
    if not parsed.hostname or not parsed.port:
        raise MilesConfigError(f"inference.urls entry {url!r} needs a host and a port")
    return f"{parsed.hostname}:{parsed.port}"


def build_argv(settings: RunConfig, ctx: LaunchContext, *, model_args: list[str] | None) -> list[str]:
    """Miles' arguments for this run (what its train.py would get)."""
    check_config(settings)
    t, sglang = miles_settings(settings), sglang_settings(settings)
    train_split, eval_split = settings.env.train_split, settings.env.eval_split
    for split in (train_split, eval_split):
        if split not in ctx.rows:
            raise MilesConfigError(f"no rows for split {split!r}; the rows writer wrote {sorted(ctx.rows)}")
    a: list[str] = ["--train-backend", t.train_backend]
    if t.train_backend == "megatron":
        a += ["--megatron-to-hf-mode", t.megatron_to_hf_mode, *(model_args or []),
              "--tensor-model-parallel-size", str(t.tensor_parallel),
              "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
              "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"]
    # Placement.
    a += ["--actor-num-nodes", str(t.num_nodes), "--actor-num-gpus-per-node", str(t.gpus_per_node),
          "--num-gpus-per-node", str(t.gpus_per_node), "--rollout-num-gpus-per-engine", str(t.rollout_gpus_per_engine)]
    a += ["--colocate"] if t.colocate else ["--rollout-num-gpus", str(rollout_gpus(settings))]
    if sglang and sglang.urls:
        a += ["--rollout-external", "--rollout-external-engine-addrs", *(_host_port(u) for u in sglang.urls)]
    # Model and checkpoints.
    a += ["--hf-checkpoint", str(settings.model.path), "--save", str(ctx.save_dir)]
    if t.checkpoint_every > 0:
        a += ["--save-interval", str(t.checkpoint_every)]
    if resume_mode(t.resume):  # latest only (the plan refuses a run id or a folder)
        a += ["--load", str(ctx.save_dir)]
    if t.ref_checkpoint:
        a += ["--ref-load", str(t.ref_checkpoint)]
    # Data: the rows writer's chat rows, prompts kept as message lists (no --apply-chat-template).
    a += ["--prompt-data", str(ctx.rows[train_split]), "--input-key", "messages", "--metadata-key", "metadata",
          "--rollout-shuffle", "--rollout-seed", str(settings.seed), "--seed", str(settings.seed)]
    eval_path = str(ctx.rows[eval_split]) + (f"@[0:{t.eval_limit}]" if t.eval_limit else "")
    a += ["--eval-prompt-data", EVAL_DATASET_NAME, eval_path,
          "--n-samples-per-eval-prompt", str(t.eval_samples_per_prompt),
          # 0: evaluate before training and after the last step only.
          "--eval-interval", str(t.eval_every if t.eval_every > 0 else t.steps)]
    # The agentic path: Miles' generate function, our agent, reward hook and group filter.
    a += ["--custom-generate-function-path", GENERATE_FUNCTION, "--custom-agent-function-path", AGENT_FUNCTION,
          "--custom-rm-path", launch_reward(settings, t.reward_hook)[0], "--dynamic-sampling-filter-path", t.group_filter,
          "--use-session-server", "--tito-model", t.tito_model]
    a += ["--tito-allowed-append-roles", *roles_key(t.append_roles).split(",")]
    template = t.chat_template_path or fixed_chat_template(t.tito_model, missing_ok=ctx.dry_run)
    if template:
        a += ["--chat-template-path", str(template)]
    kwargs = {} if t.chat_template_path else TEMPLATE_KWARGS.get(t.tito_model, {}).get(roles_key(t.append_roles))
    if kwargs:
        a += ["--apply-chat-template-kwargs", json.dumps(kwargs)]
    if t.max_seq_len:
        a += ["--max-seq-len", str(t.max_seq_len)]
    # SGLang.
    # Another engine's group holds no SGLang memory share: SGLang's own schema default then.
    mem_fraction = sglang.mem_fraction_static if sglang else SGLangInferenceConfig.mem_fraction_static
    a += ["--sglang-tool-call-parser", tool_call_parser(settings), "--sglang-mem-fraction-static", str(mem_fraction)]
    reasoning = t.reasoning_parser or (sglang.reasoning_parser if sglang else None)
    if reasoning:
        a += ["--sglang-reasoning-parser", reasoning]
    # GRPO.
    a += ["--advantage-estimator", "grpo", "--num-rollout", str(t.steps),
          "--rollout-batch-size", str(t.prompts_per_step), "--n-samples-per-prompt", str(t.samples_per_prompt),
          "--global-batch-size", str(t.global_batch_size),
          "--rollout-temperature", str(t.temperature), "--rollout-top-p", str(t.top_p),
          "--rollout-max-response-len", str(t.max_response_tokens),
          "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(t.max_tokens_per_gpu),
          "--eps-clip", str(t.clip_low), "--eps-clip-high", str(t.clip_high), "--entropy-coef", "0",
          "--optimizer", "adam", "--lr", str(t.lr), "--lr-decay-style", "constant",
          "--weight-decay", str(t.weight_decay), "--adam-beta1", "0.9", "--adam-beta2", "0.98"]
    a += lora_args(settings)
    if t.kl_coef > 0:
        a += ["--use-kl-loss", "--kl-loss-coef", str(t.kl_coef), "--kl-loss-type", t.kl_loss_type]
    # Metrics into this run's MLflow run (the launcher attaches instead of opening a new one).
    a += ["--use-mlflow", "--mlflow-tracking-uri", ctx.tracking_uri, "--mlflow-experiment-name", ctx.experiment,
          "--mlflow-run-id", ctx.run_id]
    return a + list(t.extra_args)


def build_env(ctx: LaunchContext) -> tuple[dict[str, str], set[str]]:
    """Variables the launcher needs and Ray must carry into every worker; and which of them are secret."""
    env = {REFACTOR_ENV: "1", "MLFLOW_TRACKING_URI": ctx.tracking_uri, "MLFLOW_RUN_ID": ctx.run_id,
           "PYTHONPATH": ctx.pythonpath}
    secret: set[str] = set()
    if ctx.env_token_var:
        # The agent, inside the RolloutManager actor, reads the env server's token from this variable.
        env[ctx.env_token_var] = ctx.env_token or ""
        env["AGENTRL_ENV_TOKEN_VAR"] = ctx.env_token_var  # so the launcher forwards it whatever its name
        secret.add(ctx.env_token_var)
    return env, secret


def build_launch(settings: RunConfig, ctx: LaunchContext, *, model_args: list[str] | None) -> MilesLaunch:
    """The whole launch: argv and environment."""
    t = miles_settings(settings)
    env, secret = build_env(ctx)
    # Read in the Ray workers: by the group filter, and by the agent function wrapper.
    env[MAX_DROPS_ENV] = str(t.max_drops_in_a_row)
    env[DROP_NO_SIGNAL_ENV] = "1" if t.drop_no_signal else "0"
    env[AGENT_FUNCTION_ENV] = t.agent_function
    env.update(launch_reward(settings, t.reward_hook)[1])  # reward=rubric: the rm hook builds the rubric from it
    return MilesLaunch(build_argv(settings, ctx, model_args=model_args), env, secret)
