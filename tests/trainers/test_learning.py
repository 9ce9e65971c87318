"""A toy task GRPO must solve from scratch: proves the loss, the advantages and the weight push are wired right.

The reward is the share of the 4 sampled tokens whose id lies in the lower half of the vocabulary; a random
model scores about 0.5. Sampling happens in the embedded engine, which only learns through `Learner.push`:
if the push, the sign of the advantages or the loss were wrong, the reward could not rise to 0.9.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.models.tiny import ensure_tiny_model
from agentrl.trainers.grpo.grpo_math import group_advantages
from agentrl.trainers.grpo.learner import Learner, TrainItem

STEPS, PROMPTS, SAMPLES, TOKENS = 40, 4, 8, 4


@pytest.mark.slow
def test_grpo_learns_toy_task_from_scratch(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    path = ensure_tiny_model(str(tmp_path / "tiny"), seed=3, vocab_size=512, hidden_size=64, num_layers=2,
                             num_heads=2, num_kv_heads=1, intermediate_size=128, max_position_embeddings=128)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    half = model.config.vocab_size // 2
    learner = Learner(model, lr=1e-2, temperature=1.0, micro_batch_samples=32)
    prompts = [[10 + p, 20 + p, 30 + p] for p in range(PROMPTS)]

    async def rollouts(engine: EmbeddedEngine, step: int) -> list[tuple[int, list[int], list[float]]]:
        jobs = [engine.generate(prompts[p], max_tokens=TOKENS, temperature=1.0, ignore_eos=True,
                                seed=step * 1000 + p * SAMPLES + j)
                for p in range(PROMPTS) for j in range(SAMPLES)]
        done = await asyncio.gather(*jobs)
        return [(i // SAMPLES, c.token_ids, c.logprobs) for i, c in enumerate(done)]

    curve = []
    with EmbeddedEngine(path, max_batch_sequences=64) as engine:
        for step in range(STEPS):
            outs = asyncio.run(rollouts(engine, step))
            rewards = [sum(t < half for t in toks) / TOKENS for _, toks, _ in outs]
            curve.append(sum(rewards) / len(rewards))
            if curve[-1] >= 0.9:
                break
            adv = group_advantages(rewards, [g for g, _, _ in outs])
            items = [TrainItem(prompts[g] + toks, [0] * 3 + [1] * len(toks), [0.0] * 3 + lps, float(a))
                     for (g, toks, lps), a in zip(outs, adv.tolist(), strict=True)]
            metrics = learner.step(items)
            assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
            learner.push(engine)
            assert engine.weight_version == step + 1
    assert curve[0] < 0.75, f"the toy task must start unsolved, got {curve[0]:.2f}"
    assert curve[-1] >= 0.9, f"GRPO did not learn the toy task in {STEPS} steps: {[round(c, 2) for c in curve]}"
