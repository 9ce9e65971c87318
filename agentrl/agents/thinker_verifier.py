"""Thinker-verifier (`agent=thinker_verifier`): two roles alternate turns on one conversation.

The thinker proposes a solution ending in `<final_answer>X</final_answer>`; the verifier reads it and replies
ACCEPT, or explains the mistake, which goes back to the thinker. This repeats until the verifier accepts a
proposal that holds a final answer, or `max_turns` model turns (both roles counted) have passed. An accepted
answer is scored on the row's episode (handed to the task's one tool when it has one, e.g. GridSim's
schedule or arith's answer, else as the reply); the joint outcome is one shared reward for both roles, and
0 when the verifier never accepted (an early termination).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from agentrl.agents.base import (
    PlaySettings,
    RewardFn,
    RolloutOutput,
    SessionPool,
    new_play_id,
    parse_roles,
    role_output,
    task_prompts,
    with_role,
)
from agentrl.agents.chat import new_stats, role_turn
from agentrl.agents.tool_calling import submit
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
    """Plays one row as two samples (thinker, verifier) sharing one reward."""

    def __init__(self, **config: Any) -> None:
        self.settings = PlaySettings.split(config, allowed=("roles",))
        defaults = [asdict(r) for r in ThinkerVerifierAgentConfig().roles]
        self.roles = parse_roles(self.settings.extra.get("roles"), ROLES, defaults)

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, reward_fn: RewardFn,
                   request_kwargs: dict[str, Any]) -> list[RolloutOutput]:
        system, task = task_prompts(row)
        thinker, verifier = (self.roles[n] for n in ROLES)
        play_id = new_play_id()
        urls = {r.name: await sessions.open(r.name) for r in (thinker, verifier)}
        convo = {
            thinker.name: [{"role": "system", "content": with_role(system, thinker)},
                           {"role": "user", "content": task}],
            verifier.name: [{"role": "system", "content": with_role(system, verifier)}],
        }
        stats = {thinker.name: new_stats(), verifier.name: new_stats()}
        s = self.settings
        turns, accepted, proposal, answer = 0, False, "", None
        async with async_client() as client:

            async def turn(role: str) -> str | None:
                reply = await role_turn(client, urls[role], convo[role], stats[role], request_kwargs=request_kwargs,
                                        max_response_tokens=s.max_response_tokens,
                                        max_context_tokens=s.max_context_tokens, timeout=s.model_timeout)
                return None if reply is None else reply.content

            while turns < s.max_turns:
                text = await turn(thinker.name)
                if text is None:
                    break
                turns += 1
                proposal, answer = text, final_answer(text)
                if turns >= s.max_turns:
                    break
                intro = f"{task}\n\n### Proposed solution\n" if turns == 1 else "### Revised solution\n"
                convo[verifier.name].append({"role": "user", "content": intro + text})
                verdict = await turn(verifier.name)
                if verdict is None:
                    break
                turns += 1
                if answer is not None and accepts(verdict):
                    accepted = True
                    break
                convo[thinker.name].append({"role": "user", "content": f"### Verifier\n{verdict}"})

        flagged = next((st for st in stats.values() if st.get("agentenv_failure")), None)
        if accepted:
            scored = await submit(row.get("metadata") or {}, proposal, answer=answer, reward_fn=reward_fn)
            reward = float(scored["reward"])
            joint = {k: scored[k] for k in ("agentenv_scores", "agentenv_failure", "agentenv_error") if k in scored}
        else:
            reward, joint = 0.0, {"agentenv_scores": {}}
            if flagged is not None:
                joint.update(agentenv_failure=flagged["agentenv_failure"], agentenv_error=flagged["agentenv_error"])
        shared = {**joint, "agentenv_accepted": accepted, "agentenv_answer": answer or "",
                  "agentenv_early_exit": not accepted, "agentenv_conversation_turns": turns}
        return [role_output(urls[r.name], r, reward, {**stats[r.name], **shared}, play_id)
                for r in (thinker, verifier)]
