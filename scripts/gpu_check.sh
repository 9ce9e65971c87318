#!/usr/bin/env bash
# GPU check on one GPU (sized for an H200, well under 8 minutes), with the image's torch and transformers:
#   1. the tiny recipe (gridsim_grpo) end to end on CUDA, a few steps, no warm start;
#   2. a ~0.6B Qwen3-architecture model made locally (random weights, nothing downloaded):
#      generation tokens/s through agentrl's EmbeddedEngine, training tokens/s (GRPO-style loss, AdamW),
#      peak GPU memory, and one GRPO step's time split (rollout / logprobs / train / optimizer / weight push).
# Usage: bash scripts/gpu_check.sh
# CPU smoke test of the script itself: GPU_CHECK_DEVICE=cpu GPU_CHECK_SMALL=1 GPU_CHECK_SKIP_RECIPE=1 bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
WORK="$(mktemp -d /tmp/agentrl-gpu-check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export AGENTRL_HOME="$WORK/home" PYTHONUNBUFFERED=1
START=$(date +%s)

echo "== environment"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), '| transformers', transformers.__version__); \
print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader

echo "== 1. tiny recipe on $DEVICE (gridsim_grpo, 3 steps)"
T0=$(date +%s)
RC=0
[ -n "${GPU_CHECK_SKIP_RECIPE:-}" ] || timeout 240 python3 -m agentrl +recipe=gridsim_grpo inference.device="$DEVICE" trainer.steps=3 \
  trainer.eval_every=0 trainer.eval_limit=16 trainer.warm_start.enabled=false trainer.checkpoint_every=0 \
  > "$WORK/tiny.log" 2>&1 || RC=$?
tail -n 15 "$WORK/tiny.log" 2>/dev/null
echo "tiny recipe: exit $RC in $(( $(date +%s) - T0 ))s"

echo "== 2. ~0.6B Qwen3 (random weights): generation, training, memory, step split"
timeout 360 python3 - "$DEVICE" "$WORK" <<'PY'
import asyncio, os, sys, time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

device, work = sys.argv[1], sys.argv[2]
small = os.environ.get("GPU_CHECK_SMALL") == "1"
torch.manual_seed(0)
dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
# Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads, head_dim 128), tied embeddings.
cfg = Qwen3Config(vocab_size=151936, hidden_size=1024 if not small else 64, intermediate_size=3072 if not small else 128,
                  num_hidden_layers=28 if not small else 2, num_attention_heads=16 if not small else 4,
                  num_key_value_heads=8 if not small else 2, head_dim=128 if not small else 16,
                  max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1000000.0)
model = Qwen3ForCausalLM(cfg).to(dtype)
params = sum(p.numel() for p in model.parameters())
print(f"model: {params / 1e6:.0f}M parameters, {dtype}")
folder = os.path.join(work, "qwen3-0.6b-random")
model.save_pretrained(folder)
from agentrl.models.tiny import ensure_tiny_model  # a tokenizer for the folder (ids stay below its vocab)
from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(ensure_tiny_model(os.path.join(work, "tiny"))).save_pretrained(folder)

def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()

def mem():
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")

# --- generation through agentrl's engine (continuous batching, the sampling logprobs)
from agentrl.inference.engine import EmbeddedEngine
B, P, N = (64, 512, 256) if not small else (4, 16, 8)
engine = EmbeddedEngine(folder, device=device, max_batch_sequences=B)
prompts = [torch.randint(10, 2000, (P,)).tolist() for _ in range(B)]

async def gen_all():
    return await asyncio.gather(*(engine.generate(p, max_tokens=N, temperature=1.0, ignore_eos=True) for p in prompts))

asyncio.run(gen_all())  # warm-up (kernels, allocator)
sync(); t = time.perf_counter()
outs = asyncio.run(gen_all())
sync(); gen_s = time.perf_counter() - t
gen_tokens = sum(len(o.token_ids) for o in outs)
print(f"generation: {B} sequences x {N} new tokens after {P}-token prompts: {gen_tokens / gen_s:,.0f} tokens/s "
      f"({gen_s:.2f}s, {engine.stats.forward_passes} forward passes)")

# --- training: GRPO-style clipped loss on the generated sequences, AdamW
policy = Qwen3ForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
policy.gradient_checkpointing_enable()
opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.0)
seqs = torch.tensor([p + o.token_ids for p, o in zip(prompts, outs)], device=device)
old_lp = torch.tensor([o.logprobs for o in outs], device=device, dtype=torch.float32)
adv = torch.randn(B, device=device)
mbs = 8 if not small else 2

def logprobs_of(ids):
    logits = policy(ids[:, :-1]).logits[:, P - 1:].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)

split = {}
def step():
    sync(); t0 = time.perf_counter()
    with torch.no_grad():  # the trainer's own logprobs of the rollout (old policy)
        for i in range(0, B, mbs):
            logprobs_of(seqs[i:i + mbs])
    sync(); t1 = time.perf_counter()
    for i in range(0, B, mbs):
        lp = logprobs_of(seqs[i:i + mbs])
        ratio = torch.exp(lp - old_lp[i:i + mbs])
        a = adv[i:i + mbs, None]
        loss = -torch.min(ratio * a, ratio.clamp(0.8, 1.28) * a).mean() * (mbs / B)
        loss.backward()
    sync(); t2 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    sync(); t3 = time.perf_counter()
    engine.update_weights({k: v.detach() for k, v in policy.state_dict().items()})
    sync(); t4 = time.perf_counter()
    return {"logprobs": t1 - t0, "train": t2 - t1, "optimizer": t3 - t2, "weight push": t4 - t3}

step()  # warm-up
steps = 3 if not small else 1
for _ in range(steps):
    for k, v in step().items():
        split[k] = split.get(k, 0.0) + v / steps
train_tokens = B * (P + N)
print(f"training: {train_tokens / split['train']:,.0f} tokens/s forward+backward "
      f"({B} sequences x {P + N} tokens, micro-batch {mbs}, gradient checkpointing)")
split = {"rollout (generation)": gen_s, **split}
total = sum(split.values())
print("GRPO step split: " + ", ".join(f"{k} {v:.2f}s ({100 * v / total:.0f}%)" for k, v in split.items())
      + f"; total {total:.2f}s")
print(f"peak GPU memory (torch allocator): {mem():.1f} GiB")
engine.close()
PY
RC2=$?
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
echo "== done in $(( $(date +%s) - START ))s (tiny recipe exit $RC, 0.6B benchmark exit $RC2)"
[ "$RC" = 0 ] && [ "$RC2" = 0 ]
