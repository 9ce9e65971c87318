"""Where the embedded engine's time goes: one prefill and the decode steps of 32 rows on SmolLM2-135M.

    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/micro/bench_engine_profile.py \
        [--shape 4x8] [--steps 16] [--dtype auto] [--profile]

Drives the engine's own `_prefill` / `_decode_step` from this thread (its worker thread stays idle, blocked on
its queue), on the calc_smollm2 recipe's first turn (~280 prompt tokens, the first 258 shared by every chat), as
a GRPO step sends it (`4x8`: 4 chats, 8 rows each) or N different chats. Prints the prefill's seconds, the
decode step's median milliseconds and its split into the model's forward, sampling and the rest; `--profile`
adds torch.profiler's op table over a few decode steps (self CPU time), which names what the forward spends
its time on (matmuls, attention, the cache's copies, the mask).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agentrl.inference.engines.completion import Request  # noqa: E402
from agentrl.inference.engines.embedded.batch import DecodeBatch  # noqa: E402
from agentrl.inference.engines.embedded.engine import EmbeddedEngine  # noqa: E402


def calc_prompts(tokenizer, shape: str) -> list[list[int]]:
    from benchmarks.micro.bench_vllm import Workload, calc_tools  # noqa: F401  the bench's own chats

    work = Workload("smollm2", None)
    return [tokenizer.apply_chat_template(m, tools=work.tools, add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
            for m in work.chats(shape)]


def requests(prompts: list[list[int]], max_tokens: int) -> list[Request]:
    return [Request(prompt_ids=list(p), max_tokens=max_tokens, temperature=1.0, top_p=1.0, top_k=0,
                    stop_ids=frozenset(), generator=None, future=concurrent.futures.Future()) for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder (default: the converted SmolLM2)")
    ap.add_argument("--shape", default="4x8")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--profile", action="store_true", help="torch.profiler's op table over 4 decode steps")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--unshared", action="store_true",
                    help="also decode the same rows with the shared prefix copied into every row (as before the "
                         "engine held it once), alternating steps with the shared batch, and print the ratio")
    ap.add_argument("--unpacked", action="store_true",
                    help="also time decode steps with the engine's prepacked linear layers off (plain F.linear), "
                         "alternating with steps that use them, and print the ratio")
    ap.add_argument("--gap", type=int, default=0,
                    help="also serve N of the rows through the engine's own worker (32 tokens each, T=1) and print "
                         "their logprobs' gap to a fresh float32 forward pass of the same model, row by row")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from agentrl.testing.real_model import smollm2_folder

        args.model = str(smollm2_folder())
    engine = EmbeddedEngine(args.model, dtype=args.dtype, max_batch_sequences=64)
    prompts = calc_prompts(engine.tokenizer, args.shape)
    print(f"{len(prompts)} rows, prompts {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"{len({tuple(p) for p in prompts})} distinct; dtype {engine.dtype}; {torch.get_num_threads()} threads",
          flush=True)
    forward, sample = engine._forward, engine._sample
    spent = {"forward": 0.0, "sample": 0.0}

    def timed(key, fn):
        def wrapped(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            spent[key] += time.perf_counter() - t0
            return out
        return wrapped

    engine._forward = timed("forward", forward)  # type: ignore[method-assign]
    engine._sample = timed("sample", sample)  # type: ignore[method-assign]
    steps = args.steps + (4 if args.profile else 0) + (args.steps if args.unshared else 0) + \
        (2 * args.steps if args.unpacked else 0)
    with torch.inference_mode():
        engine._prefill(requests(prompts[:2], 2))  # warm-up
        while engine._batch:
            engine._decode_step()
        t0 = time.perf_counter()
        engine._prefill(requests(prompts, steps + 2))
        print(f"prefill: {time.perf_counter() - t0:.2f} s ({engine.stats.prefill_rows - 1} distinct rows of "
              f"{len(prompts)})", flush=True)
        walls, fwd, smp = [], [], []
        for _ in range(args.steps):
            spent["forward"] = spent["sample"] = 0.0
            t0 = time.perf_counter()
            engine._decode_step()
            walls.append(time.perf_counter() - t0)
            fwd.append(spent["forward"])
            smp.append(spent["sample"])
        width = engine._batch.cache.layers[0].keys.shape[2]
        w, f, s = (1000 * statistics.median(x) for x in (walls, fwd, smp))
        print(f"decode step ({len(engine._batch)} rows, cache width ~{width}): {w:.1f} ms median "
              f"(forward {f:.1f}, sampling {s:.1f}, the rest {w - f - s:.1f}); min {1000 * min(walls):.1f}",
              flush=True)
        if args.unshared:
            compare_unshared(engine, prompts, args.steps)
        if args.unpacked:
            compare_unpacked(engine, args.steps)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(4):
                    engine._decode_step()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
        engine._batch.clear()
    engine._forward, engine._sample = forward, sample  # type: ignore[method-assign]
    if args.gap:
        logprob_gap(engine, prompts, args.gap)
    engine.close(timeout=5)


def compare_unshared(engine: EmbeddedEngine, prompts: list[list[int]], steps: int) -> None:
    """Decode steps of the running batch (the prefix held once) alternating with those of the same rows prefilled
    into a batch that copies the prefix into every row: the ratio of their medians, measured side by side."""
    shared = engine._batch
    engine._batch = DecodeBatch(share_prefix=False)
    engine._prefill(requests(prompts, steps + 2))
    unshared = engine._batch
    walls: dict[str, list[float]] = {"shared": [], "unshared": []}
    for _ in range(steps):
        for name, batch in (("shared", shared), ("unshared", unshared)):
            engine._batch = batch
            t0 = time.perf_counter()
            engine._decode_step()
            walls[name].append(time.perf_counter() - t0)
    engine._batch = shared
    a, b = (1000 * statistics.median(walls[k]) for k in ("shared", "unshared"))
    print(f"decode step, prefix held once: {a:.1f} ms median; copied into every row: {b:.1f} ms; "
          f"ratio {b / a:.2f}x (steps alternating, {steps} each)", flush=True)


def compare_unpacked(engine: EmbeddedEngine, steps: int) -> None:
    """Decode steps with the prepacked linear layers (`inference/engines/embedded/packed_linear.py`) alternating with steps that
    multiply by the plain weights (F.linear), on the same running batch: the ratio of their medians."""
    from agentrl.inference.engines.embedded.packed_linear import packed_layers

    layers = list(packed_layers(engine.model))
    walls: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(steps):
        for packed in (True, False):
            for layer in layers:
                layer.enabled = packed
            t0 = time.perf_counter()
            engine._decode_step()
            walls[packed].append(time.perf_counter() - t0)
    for layer in layers:
        layer.enabled = True
    a, b = (1000 * statistics.median(walls[k]) for k in (True, False))
    print(f"decode step, {len(layers)} linear layers prepacked: {a:.1f} ms median; plain F.linear: {b:.1f} ms; "
          f"ratio {b / a:.2f}x (steps alternating, {steps} each)", flush=True)


def logprob_gap(engine: EmbeddedEngine, prompts: list[list[int]], n: int) -> None:
    """The engine's logprobs (its worker, the rows batched with a shared prefix) against a fresh unbatched forward
    pass of a float32 copy of its weights, over n rows of 32 sampled tokens."""
    import copy

    futures = [engine.submit(p, max_tokens=32, temperature=1.0, ignore_eos=True) for p in prompts]
    done = [f.result() for f in futures][:n]
    ref = copy.deepcopy(engine.model).float().eval()
    gaps = []
    with torch.inference_mode():
        for p, c in zip(prompts, done, strict=False):
            logits = ref(torch.tensor([p + c.token_ids])).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)[len(p) - 1 : -1]
            expect = logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            gaps.append((torch.tensor(c.logprobs) - expect).abs())
    gap = torch.cat(gaps)
    print(f"logprob gap, engine ({engine.dtype}) vs a fresh float32 forward pass, {len(gap)} tokens of {len(done)} "
          f"rows: mean {gap.mean():.2e}, max {gap.max():.2e}; the engine shared {engine.stats.shared_prefix_tokens} "
          f"prefix tokens", flush=True)


if __name__ == "__main__":
    main()
