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
from agentrl.agents.demos import Demonstration, assistant, corrupt, split_transcript, teacher_answer
from agentrl.agents.episode import submit
from agentrl.agents.record import Play, Rollout
from agentrl.answers import extract_answer
from agentrl.config.agent import ThinkerVerifierAgentConfig
from agentrl.http import async_client

ROLES = ("thinker", "verifier")
_FINAL = re.compile(r"<final_answer>(.*?)</final_answer>", re.S | re.I)
_ACCEPT = re.compile(r"\bACCEPT(?:ED)?\b")
# The warm start's verifier replies: ACCEPT to the teacher's answer, this to a corrupted one.
ACCEPT, REJECT = "ACCEPT", "The final answer is wrong."
REJECT_SHARE = 0.5  # tasks whose demonstrations also show a rejected wrong answer: the verdict is not a constant


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

    def thinker_messages(self, system: str, task: str) -> list[dict[str, Any]]:
        """The thinker's opening conversation."""
        return [{"role": "system", "content": with_role(system, self.roles["thinker"])},
                {"role": "user", "content": task}]

    def verifier_messages(self, system: str) -> list[dict[str, Any]]:
        """The verifier's opening conversation (the proposals arrive as user messages)."""
        return [{"role": "system", "content": with_role(system, self.roles["verifier"])}]

    @staticmethod
    def proposal(task: str, text: str, *, first: bool) -> dict[str, Any]:
        """The user message that shows the verifier the thinker's (first or revised) proposal."""
        intro = f"{task}\n\n### Proposed solution\n" if first else "### Revised solution\n"
        return {"role": "user", "content": intro + text}

    def demonstration_options(self) -> dict[str, Any]:
        """What changes `demonstrations`: part of the SFT warm start's cache key."""
        return {"pattern": "thinker_verifier", "roles": {n: self.roles[n].prompt for n in ROLES},
                "reject_share": REJECT_SHARE}

    def demonstrations(self, transcript: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       rng: Any) -> list[Demonstration]:
        """The warm start's role turns for a bundle demonstration: the thinker proposes the teacher's answer as
        `<final_answer>`, the verifier ACCEPTs it and (on REJECT_SHARE of the tasks) rejects a corrupted one.
        Both roles play tool-less."""
        system, task, turns = split_transcript(transcript)
        answer = teacher_answer(turns)
        if answer is None:
            return []
        right = f"<final_answer>{answer}</final_answer>"
        out = [Demonstration([*self.thinker_messages(system, task), assistant(right)]),
               Demonstration([*self.verifier_messages(system), self.proposal(task, right, first=True),
                              assistant(ACCEPT)])]
        wrong = corrupt(answer, rng)
        if wrong is not None and rng.random() < REJECT_SHARE:
            out.append(Demonstration([*self.verifier_messages(system),
                                      self.proposal(task, f"<final_answer>{wrong}</final_answer>", first=True),
                                      assistant(REJECT)]))
        return out

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, request_kwargs: dict[str, Any]) -> Play:
        system, task = task_prompts(row)
        thinker, verifier = (self.roles[n] for n in ROLES)
        play_id = Rollout().play_id
        records = {r.name: r.stamp(Rollout(base_url=await sessions.open(r.name)), play_id)
                   for r in (thinker, verifier)}
        convo = {thinker.name: self.thinker_messages(system, task), verifier.name: self.verifier_messages(system)}
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
                convo[verifier.name].append(self.proposal(task, text, first=turns == 1))
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
