"""What the CLI runs against an env server of their own process share (test_env_restart, test_dependency_loss):
the tiny GRPO shape, and the env server started and counted through its log (the run's environment:
agentrl.testing.cli.cli_env)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentrl.testing.processes import wait_healthy

REPO = Path(__file__).resolve().parents[2]
# The tiny shape of test_grpo_cli's TINY, no warm start and no eval between steps.
TINY = ["+recipe=gridsim_grpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.eval_limit=1",
        "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.warm_start.enabled=false",
        "agent.max_response_tokens=64", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=64", "model.vocab_size=1024"]


def start_env_server(port: int, log: Path) -> subprocess.Popen:
    """`python -m agentrl.envs.serve` on `port`, its log (uvicorn's INFO lines included) appended to `log`."""
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl.envs.serve", "env=gridsim", "env.prompt_style=compact",
                                 f"port={port}", "log_level=info"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    wait_healthy(proc, f"http://127.0.0.1:{port}", timeout=300)
    return proc


def episodes_opened(log: Path) -> int:
    """WebSocket sessions the env server accepted so far (uvicorn logs one `connection open` each)."""
    return log.read_text(errors="replace").count("connection open") if log.exists() else 0
