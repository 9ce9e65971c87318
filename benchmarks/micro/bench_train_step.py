"""One training step's forward + backward: the plain pass vs `agentrl.trainers.common.forward`, in one process.

    python benchmarks/micro/bench_train_step.py                  # tiny model, CPU, one thread
    python benchmarks/micro/bench_train_step.py --style full     # GridSim's full prompt instead of the compact one

Batches of GridSim's optimal demonstrations (the SFT step's data; a GRPO micro-batch has the same shape) are
run through three versions of the same loss: logits at every position (the plain pass), logits only from
the first position the loss covers, and that plus the shared prompt run once. Prints the median seconds per
step of each, the ratio to the plain pass, and checks that all three give the same loss.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agentrl.envs.bundles import load_bundle  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.trainers.common.forward import first_loss_column, next_token_logits  # noqa: E402
from agentrl.trainers.sft.demonstrations import encode_demonstrations  # noqa: E402
from agentrl.trainers.sft.trainer import sft_batch  # noqa: E402


def loss_with(mode: str, model, ids, attn, targets) -> torch.Tensor:
    if mode == "plain":
        logits, first = model(input_ids=ids, attention_mask=attn).logits[:, :-1], 0
    else:
        first = first_loss_column(targets != -100)
        logits = next_token_logits(model, ids, attn, first, share_prefix=(mode == "shared prompt"))
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             targets[:, first:].reshape(-1), ignore_index=-100)


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--style", choices=("compact", "full"), default="compact")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = ensure_tiny_model(str(Path(tempfile.gettempdir()) / "agentrl-bench-models" / "tiny-s0"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = encode_demonstrations(tok, load_bundle("gridsim", prompt_style=args.style), "train", "optimal",
                                 limit=args.batch * args.repeats)
    batches = [sft_batch(data[i:i + args.batch], tok.pad_token_id)
               for i in range(0, len(data), args.batch)]
    tokens = statistics.mean(len(ids) for ids, _ in data)
    trained = statistics.mean(sum(m) for _, m in data)
    print(f"tiny model, {args.style} prompt, batch {args.batch}, {tokens:.0f} tokens per transcript "
          f"({trained:.0f} trained), {args.threads} thread(s)\n")
    modes = ("plain", "logits after the prompt", "shared prompt")
    times: dict[str, list[float]] = {m: [] for m in modes}
    losses: dict[str, float] = {}
    for ids, attn, targets in batches:  # interleaved, so drift in the machine's load hits all modes alike
        for mode in modes:
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            loss = loss_with(mode, model, ids, attn, targets)
            loss.backward()
            times[mode].append(time.perf_counter() - started)
            losses[mode] = float(loss.detach())
    base = statistics.median(times["plain"])
    print("| forward + backward | s/step (median) | speedup vs plain |\n|---|---|---|")
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"| {mode} | {med:.3f} | {base / med:.2f}x |")
    spread = max(losses.values()) - min(losses.values())
    print(f"\nlast batch's loss in the three modes differs by {spread:.2e}")
    if spread > 1e-4:
        raise SystemExit("the losses differ: the fast paths are wrong")


if __name__ == "__main__":
    main()
