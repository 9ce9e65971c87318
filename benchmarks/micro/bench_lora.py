"""LoRA against full fine-tuning, in one run, on a wider locally made Qwen3-architecture model (issue 32, proof 2).

    .venv/bin/python benchmarks/micro/bench_lora.py [--steps 3] [--rank 16] [--vllm]

Each mode (full, lora) runs in a child process of its own, so its peak RSS is its own: agentrl's `Learner` (GRPO
loss, AdamW) on the model (LoRA: PEFT-wrapped by `agentrl.trainers.common.lora.wrap`, as `model.lora.enabled` does), a
warm-up step then `--steps` timed GRPO train steps over 8 samples (two groups of 4, 160-token prompts, 64-token
replies), then pushes into an `EmbeddedEngine` through `Learner.push` (the adapter alone under LoRA). It reports
the learner's peak RSS, the bytes its tensors hold (weights, gradients, AdamW state), the optimizer state's bytes,
the push's bytes and seconds and the train step's seconds. `--vllm` adds pushes into one vLLM CPU server launched
with LoRA (scripts/install_vllm.sh's venv): the full weights (`update_weights`: reload from a saved folder) and the
adapter (`update_adapter`: /v1/load_lora_adapter). Ratios are full / LoRA, measured in this one run. Nothing is
downloaded: the model is made under a temporary folder (hidden 640, 10 layers, ~48M parameters).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# hidden 640, 10 layers, 10 heads (head_dim 64), 5 KV heads, MLP 1792, tied 2048-token embeddings: ~48M parameters
WIDE = {"hidden_size": 640, "num_layers": 10, "num_heads": 10, "num_kv_heads": 5, "intermediate_size": 1792}
GROUPS, GROUP_SIZE, PROMPT, REPLY = 2, 4, 160, 64


def make_model(work: Path) -> str:
    from agentrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(str(work / "wide-h640-l10"), **WIDE)


def lora_settings(rank: int) -> Any:
    from agentrl.config.model import LoraConfig

    return LoraConfig(enabled=True, rank=rank, alpha=2.0 * rank)


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def items(seed: int) -> list[Any]:
    """A GRPO batch: groups sharing a prompt, replies with their rollout logprobs, advantages of mean 0."""
    import torch

    from agentrl.trainers.grpo.learner import TrainItem

    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(GROUPS):
        prompt = torch.randint(10, 2000, (PROMPT,), generator=gen).tolist()
        for i in range(GROUP_SIZE):
            reply = torch.randint(10, 2000, (REPLY,), generator=gen).tolist()
            out.append(TrainItem(prompt + reply, [0] * PROMPT + [1] * REPLY, [0.0] * PROMPT + [-7.6] * REPLY,
                                 (i - (GROUP_SIZE - 1) / 2) / GROUP_SIZE))
    return out


def run_mode(mode: str, folder: str, steps: int, rank: int) -> dict[str, float]:
    """One mode in this process: the learner's steps, its memory, then pushes into an embedded engine."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.inference.engines.embedded.engine import EmbeddedEngine
    from agentrl.trainers.common.lora import wrap
    from agentrl.trainers.grpo.learner import Learner

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    lora = lora_settings(rank) if mode == "lora" else None
    if lora is not None:
        model = wrap(model, lora)
    learner = Learner(model, lr=1e-4 if lora else 1e-5, micro_batch_samples=GROUPS * GROUP_SIZE, lora=lora)
    learner.step(items(0))  # warm-up: allocator, AdamW's state made
    times = []
    for s in range(steps):
        started = time.perf_counter()
        learner.step(items(s + 1))
        times.append(time.perf_counter() - started)
    params = list(model.parameters())
    trained = [p for p in params if p.requires_grad]
    optimizer = tensor_bytes(t for state in learner.optimizer.state.values() for t in state.values()
                             if torch.is_tensor(t) and t.dim() > 0)
    result = {"parameters": sum(p.numel() for p in params), "trained_parameters": sum(p.numel() for p in trained),
              "weights_bytes": tensor_bytes(params), "gradient_bytes": tensor_bytes(trained),
              "optimizer_bytes": optimizer, "learner_tensor_bytes": tensor_bytes(params) + tensor_bytes(trained)
              + optimizer, "learner_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "train_step_s": statistics.median(times)}
    engine = EmbeddedEngine(folder)
    try:
        pushes = [learner.push(engine) for _ in range(3)]
    finally:
        engine.close()
    result.update(embedded_push_s=statistics.median(pushes), embedded_push_bytes=learner.pushed_bytes)
    return result


def vllm_pushes(folder: str, rank: int) -> dict[str, dict[str, float]]:
    """Full and adapter pushes into one vLLM CPU server started with LoRA, each timed 3 times."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.inference.engines.vllm.engine import VLLMEngine
    from agentrl.trainers.common.lora import wrap
    from agentrl.trainers.common.weight_push import adapter_state

    lora = lora_settings(rank)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    full = {k: v.detach() for k, v in model.state_dict().items()}
    peft = wrap(model, lora)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    adapter = adapter_state(peft)
    engine = VLLMEngine(folder, max_model_len=512, lora=lora)
    out: dict[str, dict[str, float]] = {"full": {}, "lora": {}}
    try:
        for mode, push in (("full", lambda: engine.update_weights(full)), ("lora", lambda: engine.update_adapter(
                adapter, lora))):
            seconds = []
            for _ in range(3):
                started = time.perf_counter()
                push()
                seconds.append(time.perf_counter() - started)
            out[mode] = {"vllm_push_s": statistics.median(seconds), "vllm_push_bytes": engine.last_push_bytes}
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed train steps per mode (after one warm-up)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--vllm", action="store_true", help="also push into a vLLM CPU server (starts one: minutes)")
    ap.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)  # a child's one mode
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.folder, args.steps, args.rank)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as work:
        folder = make_model(Path(work))
        results: dict[str, dict[str, float]] = {}
        for mode in ("full", "lora"):
            done = subprocess.run([sys.executable, __file__, "--mode", mode, "--folder", folder, "--steps",
                                   str(args.steps), "--rank", str(args.rank)], capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        if args.vllm:
            for mode, extra in vllm_pushes(folder, args.rank).items():
                results[mode].update(extra)
    full, lora = results["full"], results["lora"]
    print(f"model: {full['parameters'] / 1e6:.1f}M parameters (hidden {WIDE['hidden_size']}, {WIDE['num_layers']} "
          f"layers); LoRA rank {args.rank} on the 7 projections: {lora['trained_parameters'] / 1e6:.2f}M trained "
          f"({100 * lora['trained_parameters'] / lora['parameters']:.2f}%); batch {GROUPS}x{GROUP_SIZE} samples of "
          f"{PROMPT}+{REPLY} tokens")
    rows = [("learner peak RSS", "learner_peak_rss_bytes", "MiB"), ("learner tensors (w+g+AdamW)",
            "learner_tensor_bytes", "MiB"), ("optimizer state", "optimizer_bytes", "MiB"),
            ("gradients", "gradient_bytes", "MiB"), ("push bytes (embedded)", "embedded_push_bytes", "MiB"),
            ("push s (embedded)", "embedded_push_s", "s"), ("push bytes (vLLM)", "vllm_push_bytes", "MiB"),
            ("push s (vLLM)", "vllm_push_s", "s"), ("GRPO train step s", "train_step_s", "s")]
    print(f"{'':30s} {'full':>12s} {'LoRA':>12s} {'full / LoRA':>12s}")
    for label, key, unit in rows:
        if key not in full:
            continue
        a, b = full[key], lora[key]
        scale = 2**20 if unit == "MiB" else 1
        print(f"{label:30s} {a / scale:12.3f} {b / scale:12.3f} {a / b if b else float('inf'):11.2f}x")


if __name__ == "__main__":
    main()
