"""Co-evolution (`agent=co_evolution`): solver -> rewriter -> selector on one prompt.

`num_parallel` solvers each play the row's episode (with its tools) and are scored by the env; `num_parallel`
rewriters each see every solver's answer and play the episode again with an improved one, scored; one selector
reads the rewrites and answers `Judgment: IDX` (0-based), taking the chosen rewrite's reward. Every sample of
the play is then weighted by the reward group (`asymmetric`: x correct_weight when the selected answer is
correct, x incorrect_weight otherwise; an early exit, where no solver or no rewriter produced an answer or the
selector failed, counts as incorrect). On GridSim an answer is a submitted schedule, graded by the env.

Budgets, as in Miles: `max_context_tokens` bounds each role's whole conversation (a rewriter's prompt holds every
solver answer) and `max_response_tokens` one reply. A rollout over either is flagged (`over_budget`, `truncated`),
never cut silently: it scores 0, its group is dropped from training, and a flagged selector ends the play early.
The play is judged (`Play.judged`); the selector's rollout `holds_outcome` (eval scores its pick, unweighted),
and its `details["selected"]` names the rewrite it picked.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import asdict
from typing import Any

import httpx

from agentrl.agents.base import Role, SessionPool, agent_config, parse_roles, task_prompts, with_role
from agentrl.agents.chat import role_turn, vary_seed
from agentrl.agents.demos import (
    Demonstration,
    assistant,
    corrupt,
    near_miss,
    split_transcript,
    teacher_answer,
    with_answer,
)
from agentrl.agents.episode import play_episode, played_answer
from agentrl.agents.record import Failure, Play, Rollout
from agentrl.answers import extract_answer
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


def _answered(record: Rollout) -> bool:
    return record.failure is None and bool(record.answer.strip())


def _key(answer: str) -> str:
    """What two answers must share to be the same pick: the final answer when there is one, else the text
    without whitespace (a GridSim tool call's JSON)."""
    final = extract_answer(answer)
    return final.strip() if final is not None else "".join(answer.split())


def restated(answer: str, rewrites: list[Rollout]) -> int | None:
    """The index of the first rewrite whose answer `answer` restates, else None (an answer of its own)."""
    key = _key(answer)
    return next((i for i, r in enumerate(rewrites) if _key(r.answer) == key), None) if key else None


class CoEvolutionAgent:
    """Plays one row as `2 x num_parallel + 1` rollouts (fewer on an early exit); a judged play whose outcome
    is the selected rewrite's scores."""

    def __init__(self, **config: Any) -> None:
        self.settings = agent_config(CoEvolutionAgentConfig, config)
        self.num_parallel = int(self.settings.num_parallel)
        defaults = [asdict(r) for r in CoEvolutionAgentConfig().roles]
        self.roles = parse_roles(self.settings.roles, ROLES, defaults)

    def _with_block(self, task: str, block: str) -> str:
        """The task with the candidates' block after it, or before it (`candidates: before`)."""
        return f"{block}\n\n{task}" if self.settings.candidates == "before" else f"{task}\n\n{block}"

    def role_messages(self, role: str, system: str, task: str, answers: list[str] | None = None
                      ) -> list[dict[str, Any]]:
        """A role's opening conversation: the solver's is the task; the rewriter's and the selector's also show
        `answers` (the solvers' candidates, or the rewrites)."""
        user = task
        if role != "solver":
            title = "Candidate solutions" if role == "rewriter" else "Rewritten solutions"
            user = self._with_block(task, solutions_block(title, list(answers or [])))
        return [{"role": "system", "content": with_role(system, self.roles[role])}, {"role": "user", "content": user}]

    def demonstration_options(self) -> dict[str, Any]:
        """What changes `demonstrations`: part of the SFT warm start's cache key."""
        s = self.settings
        return {"pattern": "co_evolution", "roles": {n: self.roles[n].prompt for n in ROLES},
                "num_parallel": self.num_parallel, "candidates": s.candidates, "selection": s.selection,
                # only when set: the warm starts made before the option keep their folders
                **({"demo_candidates": s.demo_candidates} if s.demo_candidates != "far" else {})}

    def demonstrations(self, transcript: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       rng: Any) -> list[Demonstration]:
        """The warm start's role turns for a bundle demonstration: the solver plays the teacher's turns; the
        rewriter, shown num_parallel candidates of which some are corrupted (worse) answers, and the selector,
        shown as many rewrites with the teacher's among them, answer with the teacher's turns (`selection:
        judgment`: the selector names the teacher's rewrite). Candidates read as played answers do; the wrong
        ones are `corrupt`ed, or `near_miss`es under `demo_candidates: near`."""
        system, task, turns = split_transcript(transcript)
        answer = teacher_answer(turns)
        wrong = corrupt(answer, rng) if answer is not None else None
        out = [Demonstration([*self.role_messages("solver", system, task), *turns], tools)]
        if wrong is None:  # nothing to tell apart: the other roles would learn to copy a lone answer
            return out

        def wrong_one() -> str:
            near = near_miss(answer, rng) if self.settings.demo_candidates == "near" else None
            return near or corrupt(answer, rng) or wrong

        def shown(keep: int) -> list[str]:
            """num_parallel played answers, `keep` of them the teacher's at random places, the rest corrupted."""
            picks = [answer] * keep + [wrong_one() for _ in range(self.num_parallel - keep)]
            rng.shuffle(picks)
            return [played_answer(with_answer(turns, a)[-1]) for a in picks]

        candidates = shown(rng.randint(0, self.num_parallel - 1))
        out.append(Demonstration([*self.role_messages("rewriter", system, task, candidates), *turns], tools))
        rewrites = shown(rng.randint(1, self.num_parallel))
        best = played_answer(with_answer(turns, answer)[-1])
        selector = self.role_messages("selector", system, task, rewrites)
        if self.settings.selection == "answer":
            out.append(Demonstration([*selector, *turns], tools))
        else:
            out.append(Demonstration([*selector, assistant(f"Judgment: {rewrites.index(best)}")]))
        return out

    async def _episode(self, sessions: SessionPool, role: Role, messages: list[dict[str, Any]],
                       row: dict[str, Any], request_kwargs: dict[str, Any], play_id: str) -> Rollout:
        base_url = await sessions.open(role.name)
        cut: list[str] = []

        async def watch(response: httpx.Response) -> None:
            # play_episode grades a final plain reply even when it was cut at max_response_tokens; a budget
            # must flag, not truncate silently, so every reply's finish_reason is watched here.
            if response.request.url.path.endswith("/chat/completions") and response.status_code == 200:
                await response.aread()
                try:
                    choices = response.json().get("choices") or [{}]
                except ValueError:
                    return
                if choices[0].get("finish_reason") == "length":
                    cut.append(str(response.request.url))

        async with async_client(event_hooks={"response": [watch]}) as client:
            record = await play_episode(base_url, messages, request_kwargs, row.get("metadata") or {},
                                        self.settings, role=role.name, http_client=client)
        if cut:
            record.flag(Failure.TRUNCATED, f"a {role.name} reply hit max_response_tokens "
                                           f"({self.settings.max_response_tokens})")
        return role.stamp(record, play_id)

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, request_kwargs: dict[str, Any]) -> Play:
        system, task = task_prompts(row)
        solver, rewriter, selector = (self.roles[n] for n in ROLES)
        play_id = Rollout().play_id

        def early_exit(rollouts: list[Rollout]) -> Play:
            for r in rollouts:
                r.early_exit = True
            return Play(rollouts, outcome=None, judged=True)

        solver_msgs = self.role_messages(solver.name, system, task)
        solvers = list(await asyncio.gather(*(
            self._episode(sessions, solver, solver_msgs, row, vary_seed(request_kwargs, "session", k), play_id)
            for k in range(self.num_parallel))))
        answers = [r.answer for r in solvers if _answered(r)]
        if not answers:
            return early_exit(solvers)

        rewriter_msgs = self.role_messages(rewriter.name, system, task, answers)
        rewriters = list(await asyncio.gather(*(
            self._episode(sessions, rewriter, rewriter_msgs, row,
                          vary_seed(request_kwargs, "session", self.num_parallel + k), play_id)
            for k in range(self.num_parallel))))
        rewrites = [r for r in rewriters if _answered(r)]
        if not rewrites:
            return early_exit(solvers + rewriters)

        messages = self.role_messages(selector.name, system, task, [r.answer for r in rewrites])
        request_kwargs = vary_seed(request_kwargs, "session", 2 * self.num_parallel)
        if self.settings.selection == "answer":
            return await self._select_by_answer(sessions, selector, messages, row, request_kwargs, play_id,
                                                solvers + rewriters, rewrites, early_exit)
        base_url = await sessions.open(selector.name)
        judge = selector.stamp(Rollout(role=selector.name, base_url=base_url), play_id)
        async with async_client() as client:
            reply = await role_turn(client, base_url, messages, judge, request_kwargs=request_kwargs,
                                    max_response_tokens=self.settings.max_response_tokens,
                                    max_context_tokens=self.settings.max_context_tokens,
                                    timeout=self.settings.model_timeout)
        if reply is not None and reply.finish_reason == "length":
            # A cut-off judgment is not a judgment: flagged, like any role's reply over max_response_tokens.
            judge.flag(Failure.TRUNCATED, "the selector's reply hit max_response_tokens")
            reply = None
        picked = parse_judgment(reply.content, len(rewrites)) if reply is not None else None
        judge.answer = reply.content if reply is not None else ""
        judge.holds_outcome, judge.details["selected"] = True, picked
        # The selector is scored by the rewrite it picked; nothing picked: nothing scored.
        judge.scores = dict(rewrites[picked].scores or {}) if picked is not None else None
        judge.env_reward = rewrites[picked].env_reward if picked is not None else None  # its grade, too
        rollouts = solvers + rewriters + [judge]
        if picked is None:
            return early_exit(rollouts)
        return Play(rollouts, outcome=judge.scores, judged=True)

    async def _select_by_answer(self, sessions: SessionPool, selector: Role, messages: list[dict[str, Any]],
                                row: dict[str, Any], request_kwargs: dict[str, Any], play_id: str,
                                before: list[Rollout], rewrites: list[Rollout], early_exit: Any) -> Play:
        """`selection: answer`: the selector plays the episode (with its tools) seeing the rewrites; the env
        grades what it submits, and `selected` is the rewrite it restated (None: an answer of its own)."""
        judge = await self._episode(sessions, selector, messages, row, request_kwargs, play_id)
        judge.holds_outcome = True
        judge.details["selected"] = restated(judge.answer, rewrites) if _answered(judge) else None
        rollouts = [*before, judge]
        if not _answered(judge) or judge.scores is None:
            return early_exit(rollouts)
        return Play(rollouts, outcome=judge.scores, judged=True)
