"""Thinker-verifier (`agent=thinker_verifier`): two roles alternate turns on one conversation.

The thinker proposes a solution ending in `<final_answer>X</final_answer>`; the verifier reads it and replies
ACCEPT, or explains the mistake, which goes back to the thinker. This repeats until the verifier accepts a
proposal that holds a final answer, or `max_turns` model turns (both roles counted) have passed. An accepted
answer is scored on the row's episode (handed to the task's one tool when it has one, e.g. GridSim's
schedule or arith's answer, else as the reply); the joint outcome is one shared reward for both roles, and
0 when the verifier never accepted (an early termination). With `accept: agreement` the verifier also accepts
by re-solving the task to the thinker's final answer, and any final-answer form counts (`Answer:`, boxed).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from agentrl.agents.base import SessionPool, agent_config, parse_roles, task_prompts, with_role
from agentrl.agents.chat import role_turn
from agentrl.agents.record import Play, Rollout
from agentrl.agents.tool_calling import submit
from agentrl.answers import extract_answer
from agentrl.config.agent import ThinkerVerifierAgentConfig
from agentrl.http import async_client

ROLES = ("thinker", "verifier")
_FINAL = re.compile(r"<final_answer>(.*?)</final_answer>", re.S | re.I)
_ACCEPT = re.compile(r"\bACCEPT(?:ED)?\b")


def final_answer(text: str) -> str | None:
    """The last `<final_answer>...</final_answer>` in `text`, stripped; None when there is none."""
    found = [m.strip() for m in _FINAL.findall(text or "")]
    return found[-1] if found and found[-1] else None


def accepts(text: str) -> bool:
    """True when the verifier's reply accepts (an uppercase ACCEPT that is not negated)."""
    return bool(_ACCEPT.search(text or "")) and not re.search(r"\b(?:NOT|DON'T|DO NOT|CANNOT)\s+ACCEPT", text or "")


class ThinkerVerifierAgent:
    """Plays one row as two rollouts (thinker, verifier) sharing the accepted answer's scores."""

    def __init__(self, **config: Any) -> None:
        self.settings = agent_config(ThinkerVerifierAgentConfig, config)
        defaults = [asdict(r) for r in ThinkerVerifierAgentConfig().roles]
        self.roles = parse_roles(self.settings.roles, ROLES, defaults)

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, request_kwargs: dict[str, Any]) -> Play:
        system, task = task_prompts(row)
        thinker, verifier = (self.roles[n] for n in ROLES)
        play_id = Rollout().play_id
        records = {r.name: r.stamp(Rollout(base_url=await sessions.open(r.name)), play_id)
                   for r in (thinker, verifier)}
        convo = {
            thinker.name: [{"role": "system", "content": with_role(system, thinker)},
                           {"role": "user", "content": task}],
            verifier.name: [{"role": "system", "content": with_role(system, verifier)}],
        }
        s = self.settings
        agreement = s.accept == "agreement"
        turns, accepted, proposal, answer = 0, False, "", None
        async with async_client() as client:

            async def turn(role: str) -> str | None:
                record = records[role]
                reply = await role_turn(client, record.base_url, convo[role], record, request_kwargs=request_kwargs,
                                        max_response_tokens=s.max_response_tokens,
                                        max_context_tokens=s.max_context_tokens, timeout=s.model_timeout)
                return None if reply is None else reply.content

            while turns < s.max_turns:
                text = await turn(thinker.name)
                if text is None:
                    break
                turns += 1
                proposal, answer = text, final_answer(text) if not agreement else extract_answer(text)
                if turns >= s.max_turns:
                    break
                intro = f"{task}\n\n### Proposed solution\n" if turns == 1 else "### Revised solution\n"
                convo[verifier.name].append({"role": "user", "content": intro + text})
                verdict = await turn(verifier.name)
                if verdict is None:
                    break
                turns += 1
                agrees = agreement and answer is not None and extract_answer(verdict) == answer
                if answer is not None and (accepts(verdict) or agrees):
                    accepted = True
                    break
                convo[thinker.name].append({"role": "user", "content": f"### Verifier\n{verdict}"})

        # The joint outcome: the accepted answer's scores for both roles; none (reward 0) when never accepted.
        flagged = next((r for r in records.values() if r.failure is not None), None)
        joint = await submit(row.get("metadata") or {}, proposal, answer=answer) if accepted else None
        for record in records.values():
            record.answer, record.early_exit = answer or "", not accepted
            record.details.update(accepted=accepted, conversation_turns=turns)
            if joint is not None:
                record.scores, record.env_reward = joint.scores, joint.env_reward
                if joint.failure is not None:
                    record.flag(joint.failure, joint.error)
            elif flagged is not None:
                record.flag(flagged.failure, flagged.error)
        return Play([records[thinker.name], records[verifier.name]])
