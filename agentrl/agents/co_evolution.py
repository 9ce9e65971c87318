"""Co-evolution (`agent=co_evolution`): solver -> rewriter -> selector on one prompt.

`num_parallel` solvers each play the row's episode (with its tools) and are scored by the env; `num_parallel`
rewriters each see every solver's answer and play the episode again with an improved one, scored; one selector
reads the rewrites and answers `Judgment: IDX` (0-based), taking the chosen rewrite's reward. Every sample of
the play is then weighted by the reward group (`asymmetric`: x correct_weight when the selected answer is
correct, x incorrect_weight otherwise; an early exit, where no solver or no rewriter produced an answer or the
selector failed, counts as incorrect). On GridSim an answer is a submitted schedule, graded by the env.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import asdict
from typing import Any

from agentrl.agents.base import (
    PlaySettings,
    RewardFn,
    Role,
    RolloutOutput,
    SessionPool,
    new_play_id,
    parse_roles,
    reward_weight,
    role_output,
    task_prompts,
    with_role,
)
from agentrl.agents.chat import new_stats, role_turn
from agentrl.agents.tool_calling import run
from agentrl.config.agent import CoEvolutionAgentConfig
from agentrl.http import async_client

ROLES = ("solver", "rewriter", "selector")
_JUDGMENT = re.compile(r"Judgment:\s*(\d+)", re.I)


def parse_judgment(text: str, n: int) -> int | None:
    """The last `Judgment: IDX` in `text` when 0 <= IDX < n, else None."""
    found = _JUDGMENT.findall(text or "")
    if not found:
        return None
    index = int(found[-1])
    return index if 0 <= index < n else None


def solutions_block(title: str, answers: list[str]) -> str:
    return f"### {title}\n\n" + "\n\n".join(f"#### Solution {i}\n{a}" for i, a in enumerate(answers))


def _answered(out: dict[str, Any]) -> bool:
    return not out.get("agentenv_failure") and bool(str(out.get("agentenv_answer") or "").strip())


class CoEvolutionAgent:
    """Plays one row as `2 x num_parallel + 1` samples (fewer on an early exit), grouped by role."""

    def __init__(self, **config: Any) -> None:
        self.settings = PlaySettings.split(config, allowed=("num_parallel", "roles"))
        self.num_parallel = int(self.settings.extra.get("num_parallel", 5))
        if self.num_parallel < 1:
            raise ValueError(f"num_parallel must be at least 1, not {self.num_parallel}")
        defaults = [asdict(r) for r in CoEvolutionAgentConfig().roles]
        self.roles = parse_roles(self.settings.extra.get("roles"), ROLES, defaults)

    async def _episode(self, sessions: SessionPool, role: Role, messages: list[dict[str, Any]], row: dict[str, Any],
                       reward_fn: RewardFn, request_kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        base_url = await sessions.open(role.name)
        out = await run(base_url, messages, request_kwargs, row.get("metadata") or {}, reward_fn=reward_fn,
                        **self.settings.run_kwargs())
        return base_url, out

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, reward_fn: RewardFn,
                   request_kwargs: dict[str, Any]) -> list[RolloutOutput]:
        system, task = task_prompts(row)
        solver, rewriter, selector = (self.roles[n] for n in ROLES)
        play_id = new_play_id()

        solver_msgs = [{"role": "system", "content": with_role(system, solver)}, {"role": "user", "content": task}]
        solvers = await asyncio.gather(*(self._episode(sessions, solver, solver_msgs, row, reward_fn, request_kwargs)
                                         for _ in range(self.num_parallel)))
        answers = [out["agentenv_answer"] for _, out in solvers if _answered(out)]
        samples = [(solver, url, out) for url, out in solvers]
        if not answers:
            return self._weighted(samples, None, reward_fn, play_id, early_exit=True)

        rewriter_msgs = [{"role": "system", "content": with_role(system, rewriter)},
                         {"role": "user", "content": f"{task}\n\n{solutions_block('Candidate solutions', answers)}"}]
        rewriters = await asyncio.gather(*(
            self._episode(sessions, rewriter, rewriter_msgs, row, reward_fn, request_kwargs)
            for _ in range(self.num_parallel)))
        samples += [(rewriter, url, out) for url, out in rewriters]
        rewrites = [out for _, out in rewriters if _answered(out)]
        if not rewrites:
            return self._weighted(samples, None, reward_fn, play_id, early_exit=True)

        base_url = await sessions.open(selector.name)
        block = solutions_block("Rewritten solutions", [r["agentenv_answer"] for r in rewrites])
        messages = [{"role": "system", "content": with_role(system, selector)},
                    {"role": "user", "content": f"{task}\n\n{block}"}]
        stats = new_stats()
        async with async_client() as client:
            reply = await role_turn(client, base_url, messages, stats, request_kwargs=request_kwargs,
                                    max_response_tokens=self.settings.max_response_tokens,
                                    max_context_tokens=self.settings.max_context_tokens,
                                    timeout=self.settings.model_timeout)
        picked = parse_judgment(reply.content, len(rewrites)) if reply is not None else None
        selected = float(rewrites[picked]["reward"]) if picked is not None else None
        stats.update(reward=selected or 0.0, agentenv_selected=picked, agentenv_answer=reply.content if reply else "",
                     agentenv_scores=dict(rewrites[picked]["agentenv_scores"]) if picked is not None else {})
        samples.append((selector, base_url, stats))
        return self._weighted(samples, selected, reward_fn, play_id, early_exit=picked is None)

    @staticmethod
    def _weighted(samples: list[tuple[Role, str, dict[str, Any]]], selected: float | None, reward_fn: RewardFn,
                  play_id: str, *, early_exit: bool) -> list[RolloutOutput]:
        weight = reward_weight(reward_fn, None if early_exit else selected)
        return [role_output(url, role, out.get("reward", 0.0),
                            {**out, "agentenv_early_exit": early_exit, "agentenv_selected_reward": selected},
                            play_id, weight)
                for role, url, out in samples]
