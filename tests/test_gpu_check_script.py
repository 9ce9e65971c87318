"""scripts/gpu_check.sh in its CPU smoke mode: the script a GPU session runs once, so it must work at the first try."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?)"


def _num(pattern: str, text: str) -> list[float]:
    match = re.search(pattern.replace("{N}", NUM), text)
    assert match, f"no line matching {pattern!r} in the output:\n{text}"
    return [float(g.replace(",", "")) for g in match.groups()]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a hang net only: on a CPU the script sets no limits of its own
def test_gpu_check_cpu_smoke(tmp_path: Path) -> None:
    # This interpreter's folder first on PATH: the script calls `python3`. No carried wheels: this Python has all.
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_SMALL": "1", "GPU_CHECK_NO_WHEELS": "1",
           "TMPDIR": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("AGENTRL_HOME", None)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=3300)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-4000:]}"
    assert "all modules import" in out
    assert "tiny recipe: exit 0" in out

    # Part 1: the recipe's mean step split, read back from its own MLflow store.
    gen, train, push, step, plays = _num(r"recipe step split \(mean of steps 2-2\): generate {N}s \(\d+%\), "
                                         r"train {N}s \(\d+%\), weight push {N}s \(\d+%\); step {N}s "
                                         r"\(step 1: [^)]*\); the plays themselves {N}s", out)
    # "generate" is what step 2 waited for its play, which ran while step 1 trained (overlapped rollouts): 0 when
    # that play was done first. The play itself always takes time.
    assert plays > 0 and gen >= 0 and step > 0 and gen + train + push <= step * 1.01 + 1e-3
    (trained,) = _num(r"steps that trained: (\d+) of 2", out)
    assert trained >= 1, "the warm start should give GRPO groups that differ in reward"
    if trained == 2:  # the mean covers step 2, which then updated the model
        assert train > 0

    # Part 2: the engine generates, agentrl's Learner trains and pushes, the split adds up.
    (gen_tps,) = _num(r"generation: 4 sequences \(2 prompts x 2\) x 8 new tokens after 24-token prompts: {N} tokens/s",
                      out)
    assert gen_tps > 0
    # Same weights, float32 on both sides: the learner's logprobs (shared-prompt forward) equal the engine's.
    (approx_kl,) = _num(r"approx_kl {N}", out)
    assert approx_kl < 1e-6
    (train_tps,) = _num(r"training: {N} tokens/s forward\+backward\+AdamW", out)
    assert train_tps > 0
    rollout, train_step, weight_push, total = _num(
        r"GRPO step split \(mean of 1\): rollout {N}s \(\d+%\), train step {N}s \(\d+%\), "
        r"weight push {N}s \(\d+%\); total {N}s", out)
    assert min(rollout, train_step) > 0 and weight_push >= 0
    assert abs(rollout + train_step + weight_push - total) < 0.02
    # Part 3: the LoRA 4B recipe's learner (here its small shape): an adapter trains, one step has a gradient.
    assert re.search(r"lora 4b: [\d.,]+M parameters .*, [\d.]+M trained \([\d.]+%\), AdamW state", out), out
    assert re.search(r"lora 4b: one GRPO step over 4 x \d+ tokens in [\d.]+s", out)
    assert re.search(r"== done in \d+s \(tiny recipe exit 0, 0.6B benchmark exit 0, lora 4b exit 0\)", out)
    # The script cleans up its work folder (models, the MLflow store) on exit.
    assert not list(tmp_path.glob("agentrl-gpu-check.*"))
