"""A toy task co-evolution must learn: the selected answer's reward rises within a fixed number of GRPO steps.

The task (`LettersBundle`): reply with a few letters; the env scores the share of them in a..m, so a model that
writes letters at random scores about 0.5. A tiny model first learns, by a few SFT steps here, to reply with a
short run of random letters and stop (as a recipe's warm start teaches the task's format: a reply cut at
max_response_tokens is flagged, and would leave nothing to train on). Then co-evolution plays each row with
solvers, rewriters that see the solvers' replies, and a selector that restates one (`selection: answer`),
through the real engine, session server, env server, runner, reward group (asymmetric), group filter, learner
and weight push. If the role grouping, the weighting, the advantages' sign, the loss or the push were broken,
the selected answer's reward could not rise by the margin asserted.
"""

from __future__ import annotations

import asyncio
import random
import string
from typing import Any

import pytest
import torch

from agentrl.agents.co_evolution import CoEvolutionAgent, solutions_block
from agentrl.envs.server import build_app, serve_in_background
from agentrl.envs.task import Bundle, Episode, TaskInfo, ToolResult, Turn
from agentrl.group_filter import group_drop_reason
from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.sessions.server import start_session_server
from agentrl.models.tiny import ensure_tiny_model
from agentrl.play.evaluate import outcome_of
from agentrl.play.rollout import RolloutRunner, make_row
from agentrl.rewards import Asymmetric
from agentrl.trainers.grpo.learner import Learner, items_from

STEPS, ROWS, PLAYS, N = 24, 2, 4, 2
MAX_LETTERS = 6
LOW = set("abcdefghijklm")
SYSTEM, PROMPT = "You write letters.", "Reply with a few letters (at most 6)."
ROLES = [{"name": "solver", "prompt": "Solve the task."},
         {"name": "rewriter", "prompt": "Write one improved solution."},
         {"name": "selector", "prompt": "Pick the best rewritten solution and restate it."}]


def letters_score(reply: str) -> float:
    """The share of the reply's letters that lie in a..m; 0 without letters or with more than MAX_LETTERS (a
    graded penalty keeps replies short: a reply cut at max_response_tokens would be flagged and not trained)."""
    letters = [c for c in reply.lower() if c in string.ascii_lowercase]
    if not letters or len(letters) > MAX_LETTERS:
        return 0.0
    return sum(c in LOW for c in letters) / len(letters)


class LettersEpisode(Episode):
    def __init__(self, info: TaskInfo) -> None:
        self.info, self._scores = info, {}

    def first_turn(self) -> Turn:
        return Turn(prompt=PROMPT, system_prompt=SYSTEM)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(f"no tool {name!r}", is_error=True)

    def end_turn(self, response: str) -> Turn | None:
        self._scores = {"letters": letters_score(response)}
        return None

    @property
    def done(self) -> bool:
        return bool(self._scores)

    def scores(self) -> dict[str, float]:
        return dict(self._scores)


class LettersBundle(Bundle):
    name, version, inline_episodes = "letters", "1", True

    def splits(self) -> dict[str, int]:
        return {"train": 64, "eval": 16}

    def task_info(self, split: str, index: int) -> TaskInfo:
        return TaskInfo(f"letters-{split}-{index}", split, index)

    def episode(self, split: str, index: int) -> Episode:
        return LettersEpisode(self.task_info(split, index))

    def spec(self) -> dict[str, Any]:
        return {"bundle": "letters"}


def warm_start(model: Any, tokenizer: Any, steps: int = 100) -> None:
    """Teach the replies' format: a few random letters, then stop, under each role's prompt."""
    rng = random.Random(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = torch.zeros(())
        for role in ROLES:
            user = PROMPT
            if role["name"] != "solver":
                title = "Candidate solutions" if role["name"] == "rewriter" else "Rewritten solutions"
                user += "\n\n" + solutions_block(title, ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=3))
                                                         for _ in range(N)])
            messages = [{"role": "system", "content": f"{SYSTEM}\n\n{role['prompt']}"},
                        {"role": "user", "content": user}]
            reply = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=3))
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   enable_thinking=False, return_dict=False)
            target = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids = torch.tensor([list(prompt) + target])
            logits = model(ids).logits[0, len(prompt) - 1:-1]
            loss = loss + torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.mark.slow
def test_co_evolution_selected_answer_learns_toy_task(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    path = ensure_tiny_model(str(tmp_path / "tiny"), seed=3, vocab_size=512, hidden_size=64, num_layers=2,
                             num_heads=2, num_kv_heads=1, intermediate_size=128, max_position_embeddings=512)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    warm_start(model, tokenizer)
    start = tmp_path / "start"
    model.save_pretrained(start)
    tokenizer.save_pretrained(start)

    bundle = LettersBundle()
    agent = CoEvolutionAgent(num_parallel=N, max_turns=1, max_response_tokens=16, selection="answer", roles=ROLES)
    learner = Learner(model, lr=5e-3, temperature=1.0, micro_batch_samples=32)
    kwargs = {"temperature": 1.0, "chat_template_kwargs": {"enable_thinking": False}}
    curve: list[float] = []
    kept_groups = 0
    with EmbeddedEngine(str(start), max_batch_sequences=64) as engine, \
            serve_in_background(build_app(bundle)) as env_url:
        server = start_session_server(engine, default_max_tokens=16)
        try:
            runner = RolloutRunner(agent, server, reward=Asymmetric())
            for step in range(STEPS):
                rows = [make_row(bundle, "train", (step * ROWS + i) % 64, env_url, {}) for i in range(ROWS)]
                groups = asyncio.run(runner.play_rows(rows, PLAYS, request_kwargs=kwargs, seed_parts=(0, step)))
                plays: dict[str, list] = {}
                for r in (r for g in groups for r in g):
                    plays.setdefault(r.play_id, []).append(r)
                curve.append(sum(outcome_of(p).score for p in plays.values()) / len(plays))
                passed = [g for g in groups if group_drop_reason(g) is None]  # the trainer's row filter
                kept_groups += len(passed)
                kept = [r for g in passed for r in g]
                items, _ = items_from(kept)
                if items:
                    learner.step(items)
                    learner.push(engine)
        finally:
            server.stop()
    start_mean, end_mean = sum(curve[:4]) / 4, sum(curve[-4:]) / 4
    shown = [round(c, 2) for c in curve]
    assert 0.2 < start_mean < 0.75, f"the warm start must begin near chance, got {shown}"
    assert kept_groups >= STEPS // 2, f"too few rows passed the filter ({kept_groups} of {STEPS * ROWS}): {shown}"
    assert end_mean > start_mean + 0.2, f"the selected answer's reward did not rise in {STEPS} steps: {shown}"
