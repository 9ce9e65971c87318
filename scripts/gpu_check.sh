#!/usr/bin/env bash
# GPU check on one GPU (sized for an H200: about 3 minutes, every part under a timeout), with the image's torch
# and transformers:
#   0. installs the carried wheels (.whl/, made here by scripts/gpu_wheels.sh) and stops at once when a module
#      agentrl needs is still missing;
#   1. the tiny recipe (gridsim_grpo) end to end on the device: a short SFT warm start, 5 GRPO steps, and the mean
#      step-time split it logged to MLflow (time/generate_wait_s, time/train_s, time/weight_push_s);
#   2. a ~0.6B Qwen3-architecture model made locally (random weights, nothing downloaded): generation tokens/s
#      through agentrl's EmbeddedEngine, training tokens/s through agentrl's Learner (GRPO loss, AdamW, float32
#      weights with bf16 autocast), peak GPU memory, and a GRPO step's split (rollout / train step / weight push);
#   3. recipes/gridsim_lora_4b.yaml's learner on a Qwen3-4B-shaped model made locally (random bf16 weights): LoRA
#      rank 16, gradient checkpointing, one GRPO step, its peak GPU memory against docs/models.md's projection.
# Usage (the device call; see docs/miles.md "GPU check"): bash scripts/gpu_check.sh
# CPU smoke test of the script itself (about a minute): GPU_CHECK_DEVICE=cpu GPU_CHECK_SMALL=1 bash scripts/gpu_check.sh
# (add GPU_CHECK_NO_WHEELS=1 where every dependency is installed; scripts/gpu_rehearsal.sh plays the GPU image).
# Knobs: GPU_CHECK_WHEELS (folder of wheels, default .whl), GPU_CHECK_NO_WHEELS=1 (install nothing),
#        GPU_CHECK_SKIP_RECIPE=1 (part 2 only).
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
SMALL="${GPU_CHECK_SMALL:-0}"
WHEELS="${GPU_CHECK_WHEELS:-.whl}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/agentrl-gpu-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export AGENTRL_HOME="$WORK/home" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
unset MLFLOW_TRACKING_URI  # the recipe's MLflow store must be the one under $AGENTRL_HOME, read below
START=$(date +%s)
# A short warm start (SFT on the device too) so GRPO groups differ in reward and the learner trains: from the
# random tiny model every group scores 0 and is filtered out. Few extra rows bound a step that finds no signal.
if [ "$SMALL" = 1 ]; then RECIPE_STEPS=2 RECIPE_EVAL=2 RECIPE_SFT=100 RECIPE_TIMEOUT=150
else RECIPE_STEPS=5 RECIPE_EVAL=16 RECIPE_SFT=300 RECIPE_TIMEOUT=200; fi
# The timeouts guard the GPU's short device budget. On a CPU (the smoke test, a rehearsal) nothing is rationed and a
# shared 2-core box may run ten times slower than idle, so there are none (`timeout 0` disables; the caller keeps
# its own hang net). GPU_CHECK_TIMEOUT_SCALE multiplies every limit (0: none).
if [ "$DEVICE" = cpu ]; then SCALE="${GPU_CHECK_TIMEOUT_SCALE:-0}"; else SCALE="${GPU_CHECK_TIMEOUT_SCALE:-1}"; fi
RECIPE_TIMEOUT=$(( RECIPE_TIMEOUT * SCALE ))

echo "== 0. environment"
if [ -z "${GPU_CHECK_NO_WHEELS:-}" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
  T0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
    "$WHEELS"/*.whl || { echo "STOP: pip could not install the wheels in $WHEELS"; exit 3; }
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  echo "installed $(compgen -G "$WHEELS/*.whl" | wc -l) wheels from $WHEELS in $(( $(date +%s) - T0 ))s"
fi
timeout $(( 120 * SCALE )) python3 - <<'PY' || { echo "STOP: a module agentrl needs is missing or broken here (above); nothing was run on the GPU"; exit 3; }
import importlib
import sys

import torch
import transformers

print(f"python {sys.version.split()[0]} | torch {torch.__version__} cuda {torch.version.cuda} available "
      f"{torch.cuda.is_available()} | transformers {transformers.__version__}")
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
missing = []
for name in ("hydra", "omegaconf", "fastapi", "uvicorn", "websockets", "httpx", "mlflow", "docker", "pydantic",
             "sqlalchemy", "alembic", "matplotlib", "tqdm", "agentrl.__main__", "agentrl.run",
             "agentrl.trainers.grpo.trainer", "agentrl.trainers.grpo.learner",
             "agentrl.inference.engines.embedded.engine"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is a reason to stop before the GPU work
        missing.append(f"  {name}: {type(exc).__name__}: {exc}")
if missing:
    print("MISSING (carry them as wheels: bash scripts/gpu_wheels.sh, then carry=['.whl']):\n" + "\n".join(missing))
    sys.exit(1)
print("all modules import")
PY
if [ -n "${PYTHONPATH:-}" ]; then  # informational: the carried wheels' requirements the image's versions miss
  timeout $(( 60 * SCALE )) python3 -m pip check 2>/dev/null | grep -v "^No broken" | head -n 20 || true
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader

echo "== 1. tiny recipe on $DEVICE (gridsim_grpo: $RECIPE_SFT SFT warm-start steps, $RECIPE_STEPS GRPO steps, eval_limit $RECIPE_EVAL)"
T0=$(date +%s)
RC=0
if [ -z "${GPU_CHECK_SKIP_RECIPE:-}" ]; then
  OVERRIDES=(+recipe=gridsim_grpo inference.device="$DEVICE" trainer.steps="$RECIPE_STEPS" trainer.eval_every=0
    trainer.eval_limit="$RECIPE_EVAL" trainer.checkpoint_every=0 trainer.max_extra_rows=2
    trainer.warm_start.steps="$RECIPE_SFT" trainer.warm_start.augment=0 trainer.temperature=1.1
    trainer.model_failures=penalize)
  # The check needs steps that train. A warm start this short truncates or garbles many replies: dropped (the
  # recipe's default), they take their whole group with them, and at the flagship's T=0.6 the rest are alike; kept
  # at reward 0 and sampled at 1.1, a group's rewards differ.
  # trainer.device came with the GPU training change; an older checkout trains where inference.device says.
  if python3 -c "from agentrl.config.trainer import GRPOTrainerConfig as C; assert 'device' in C.__dataclass_fields__" \
    2>/dev/null; then OVERRIDES+=(trainer.device="$DEVICE"); fi
  echo "python3 -m agentrl ${OVERRIDES[*]}"
  timeout "$RECIPE_TIMEOUT" python3 -m agentrl "${OVERRIDES[@]}" > "$WORK/tiny.log" 2>&1 || RC=$?
  [ "$RC" = 0 ] || tail -n 25 "$WORK/tiny.log"
  grep -a -E "final eval/(grade|reward)" "$WORK/tiny.log" | tail -n 2
  # On the device, $OUT comes back to the session: the whole log is there for a failure the tail does not explain.
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$WORK/tiny.log" "$OUT/tiny_recipe.log"; fi
  timeout $(( 60 * SCALE )) python3 - "$AGENTRL_HOME" <<'PY' || true
import sqlite3, sys
from pathlib import Path

# The run's own MLflow store (SQLite under $AGENTRL_HOME/outputs): every metric of every step.
dbs = sorted(Path(sys.argv[1]).rglob("mlflow.db"))
if not dbs:
    sys.exit("recipe: no MLflow store found (the run failed before logging)")
con = sqlite3.connect(dbs[0])
rows = con.execute("SELECT key, step, value FROM metrics WHERE step > 0 AND (key LIKE 'time/%' OR key LIKE 'perf/%' "
                   "OR key IN ('train/reward', 'rollout/model_tokens', 'train/tokens'))").fetchall()
by_key: dict[str, dict[int, float]] = {}
for key, step, value in rows:
    by_key.setdefault(key, {})[step] = value
steps = sorted(by_key.get("time/step_s", {}))
if not steps:
    sys.exit("recipe: no step metrics in the MLflow store")
# The first step pays for warm-up (kernels, allocator); the mean leaves it out when there are more.
kept = steps[1:] or steps
mean = {k: sum(v[s] for s in kept if s in v) / max(1, sum(s in v for s in kept)) for k, v in by_key.items()}
step_s = mean["time/step_s"]
# "generate" is what the step waited for: with overlapped rollouts (trainer.max_staleness=1, the default) the
# next step's play runs while this one trains, so the play's own time (time/generate_s) is not part of the step.
parts = [("generate", "time/generate_wait_s"), ("train", "time/train_s"), ("weight push", "time/weight_push_s")]
print(f"recipe step split (mean of steps {kept[0]}-{kept[-1]}): "
      + ", ".join(f"{name} {mean.get(k, 0.0):.3f}s ({100 * mean.get(k, 0.0) / step_s:.0f}%)" for name, k in parts)
      + f"; step {step_s:.3f}s (step 1: {by_key['time/step_s'][steps[0]]:.3f}s); "
      f"the plays themselves {mean.get('time/generate_s', 0.0):.3f}s")
trained = [s for s in steps if by_key.get("train/tokens", {}).get(s, 0) > 0]
print(f"recipe throughput: generate {mean.get('perf/generate_tokens_per_s', 0):,.0f} model tokens/s, "
      f"train {mean.get('perf/train_tokens_per_s', 0):,.0f} loss tokens/s, train/reward {mean.get('train/reward', 0):.3f}; "
      f"steps that trained: {len(trained)} of {len(steps)} (a step whose groups all tie in reward skips the update)")
PY
fi
echo "tiny recipe: exit $RC in $(( $(date +%s) - T0 ))s"

echo "== 2. ~0.6B Qwen3 (random weights): generation, Learner training, memory, step split"
timeout $(( 240 * SCALE )) python3 - "$DEVICE" "$WORK" "$SMALL" <<'PY'
import asyncio, os, sys, time
import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.models.tiny import ensure_tiny_model
from agentrl.trainers.grpo.learner import Learner, TrainItem

device, work, small = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
cuda = device.startswith("cuda")
torch.manual_seed(0)
# Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads, head_dim 128, tied embeddings); SMALL keeps its vocabulary.
shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16) if small else dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                             num_attention_heads=16, num_key_value_heads=8, head_dim=128)
cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1000000.0,
                  **shape)
t = time.perf_counter()
with torch.device(device):  # random init on the GPU: seconds rather than a minute on the CPU
    model = Qwen3ForCausalLM(cfg)
folder = os.path.join(work, "qwen3-0.6b-random")
model.to(torch.bfloat16 if cuda else torch.float32).save_pretrained(folder)
del model
if cuda:  # the peaks below are the engine's and the learner's, not the model's making
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
# A tokenizer for the folder (the prompts' ids stay below its vocabulary).
AutoTokenizer.from_pretrained(ensure_tiny_model(os.path.join(work, "tiny"))).save_pretrained(folder)
print(f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, made and saved in {time.perf_counter() - t:.1f}s")

def sync():
    if cuda:
        torch.cuda.synchronize()

def gib(x):
    return f"{x / 2**30:.1f} GiB" if cuda else "n/a (cpu)"

# --- generation through agentrl's engine (continuous batching; the sampling logprobs come back)
# GRPO-shaped: groups of G samples share a prompt (the learner then runs each group's prompt once).
B, G, P, N = (4, 2, 24, 8) if small else (64, 8, 512, 256)
engine = EmbeddedEngine(folder, device=device, max_batch_sequences=B)
params = sum(p.numel() for p in engine.model.parameters())
print(f"engine: {params / 1e6:.0f}M parameters, {engine.dtype} on {engine.device}")

def generate(prompts, n):
    async def all_of():
        return await asyncio.gather(*(engine.generate(p, max_tokens=n, temperature=1.0, ignore_eos=True)
                                      for p in prompts))
    return asyncio.run(all_of())

def prompts_of(count):
    return [p for _ in range(count // G) for p in [torch.randint(10, 2000, (P,)).tolist()] * G]

generate(prompts_of(B), 8)  # warm-up (kernels, allocator)
sync(); t = time.perf_counter()
prompts = prompts_of(B)
outs = generate(prompts, N)
sync(); gen_s = time.perf_counter() - t
gen_tokens = sum(len(o.token_ids) for o in outs)
passes = engine.stats.forward_passes if hasattr(engine.stats, "forward_passes") else "?"
print(f"generation: {B} sequences ({B // G} prompts x {G}) x {N} new tokens after {P}-token prompts: {gen_tokens / gen_s:,.0f} tokens/s "
      f"({gen_s:.2f}s, {gen_s / N * 1000:.1f} ms per decode step, {passes} forward passes in all)")
gen_peak = torch.cuda.max_memory_allocated() if cuda else 0

# --- training through agentrl's Learner: float32 weights on the device (bf16 autocast on CUDA), AdamW
policy = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
mbs = 2 if small else 8
learner = Learner(policy, lr=1e-6, micro_batch_samples=mbs, pad_id=engine.pad_id)
adv = torch.randn(B).tolist()

def items_of(prompts, outs):
    return [TrainItem(p + o.token_ids, [0] * len(p) + [1] * len(o.token_ids), [0.0] * len(p) + list(o.logprobs), a)
            for p, o, a in zip(prompts, outs, adv)]

if cuda:
    torch.cuda.reset_peak_memory_stats()
# The first step also checks the engine against the learner: same weights, so the ratio is ~1.
sync(); t = time.perf_counter()
first = learner.step(items_of(prompts, outs))
sync(); first_s = time.perf_counter() - t
print(f"learner step 1 ({first_s:.2f}s, warm-up): approx_kl {first['train/approx_kl']:.2e}, "
      f"clip_fraction {first['train/clip_fraction']:.3f} (engine {engine.dtype} vs learner logprobs, same weights)")
first_push = learner.push(engine)
steps = 1 if small else 2
split = {"rollout": 0.0, "train step": 0.0, "weight push": 0.0}
for _ in range(steps):
    sync(); t = time.perf_counter()
    prompts = prompts_of(B)
    outs = generate(prompts, N)
    sync(); t1 = time.perf_counter()
    learner.step(items_of(prompts, outs))
    sync(); t2 = time.perf_counter()
    push_s = learner.push(engine)
    split["rollout"] += (t1 - t) / steps
    split["train step"] += (t2 - t1) / steps
    split["weight push"] += push_s / steps
train_tokens = sum(len(p) + len(o.token_ids) for p, o in zip(prompts, outs))
print(f"training: {train_tokens / split['train step']:,.0f} tokens/s forward+backward+AdamW "
      f"({B} sequences x {P + N} tokens, {B * N / split['train step']:,.0f} loss tokens/s, micro-batch {mbs}, "
      f"first push {first_push:.2f}s)")
total = sum(split.values())
print(f"GRPO step split (mean of {steps}): " + ", ".join(f"{k} {v:.2f}s ({100 * v / total:.0f}%)" for k, v in split.items())
      + f"; total {total:.2f}s")
train_peak = torch.cuda.max_memory_allocated() if cuda else 0
print(f"peak GPU memory (torch allocator): generation {gib(gen_peak)}, training with the engine resident {gib(train_peak)}")
engine.close()
PY
RC2=$?

echo "== 3. LoRA on a Qwen3-4B-shaped model (random weights): recipes/gridsim_lora_4b.yaml's learner, peak memory"
# The recipe's learner settings (model.lora rank 16 on the 7 projections, bf16 weights, gradient checkpointing,
# micro-batch 4 of 2,048 tokens) for one GRPO step; docs/models.md "LoRA on one GPU" projects ~17 GB for it.
timeout $(( 150 * SCALE )) python3 - "$DEVICE" "$SMALL" <<'PY'
import sys, time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from agentrl.config.model import LoraConfig, ModelConfig
from agentrl.trainers.grpo.learner import Learner, TrainItem
from agentrl.trainers.common.lora import parameter_counts, wrap
from agentrl.trainers.common.trained_model import prepare_for_training

device, small = sys.argv[1], sys.argv[2] == "1"
cuda = device.startswith("cuda")
shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=2048) if small else dict(
    hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=151936)
cfg = Qwen3Config(max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1000000.0, **shape)
dtype = torch.bfloat16 if cuda else torch.float32
torch.manual_seed(0)
torch.set_default_dtype(dtype)
with torch.device(device):
    model = Qwen3ForCausalLM(cfg)
torch.set_default_dtype(torch.float32)
base_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
# as model.gradient_checkpointing=true (the recipe's; the schema's other keys at their defaults)
model = prepare_for_training(model, ModelConfig(_target_="unused", path="unused", gradient_checkpointing=True))
lora = LoraConfig(enabled=True, rank=16, alpha=32.0)
model = wrap(model, lora)
trained, total = parameter_counts(model)
learner = Learner(model, lr=2e-4, micro_batch_samples=4, lora=lora)
S, P = (4, 64) if small else (4, 2048)
items = [TrainItem(torch.randint(10, cfg.vocab_size, (P,)).tolist(), [0] * (P // 2) + [1] * (P - P // 2),
                   [-5.0] * P, a) for a in (-1.0, -0.3, 0.3, 1.0)][:S]
if cuda:
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
t = time.perf_counter()
metrics = learner.step(items)
if cuda:
    torch.cuda.synchronize()
step_s = time.perf_counter() - t
state = sum(v.numel() * v.element_size() for st in learner.optimizer.state.values() for v in st.values()
            if torch.is_tensor(v) and v.dim() > 0)
peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
print(f"lora 4b: {total / 1e6:,.1f}M parameters ({base_gib:.1f} GiB of base weights), {trained / 1e6:.1f}M trained "
      f"({100 * trained / total:.2f}%), AdamW state {state / 2**20:.0f} MiB, grad_norm {metrics['train/grad_norm']:.3g}")
print(f"lora 4b: one GRPO step over {S} x {P} tokens in {step_s:.2f}s; peak GPU memory (torch allocator) "
      + (f"{peak:.1f} GiB (docs/models.md projects ~17 GB for the learner)" if cuda else "n/a (cpu)"))
PY
RC3=$?
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
echo "== done in $(( $(date +%s) - START ))s (tiny recipe exit $RC, 0.6B benchmark exit $RC2, lora 4b exit $RC3)"
[ "$RC" = 0 ] && [ "$RC2" = 0 ] && [ "$RC3" = 0 ]
