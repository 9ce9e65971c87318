"""Adversarial (`agent=adversarial`): a proposer writes a problem variant, a solver answers it.

The proposer reads the row's problem and writes a variant as `<problem>...</problem>` with its exact value as
`<expression>...</expression>`, an arithmetic expression the agent evaluates itself. Only a valid, verifiable
variant counts: the expression must evaluate exactly to an integer (and match a stated `Answer:`, if any).
The solver then answers the variant, checked with arith's verifier against that integer. The solver is
rewarded for surviving (1 when right), the proposer for breaking it (1 when the solver is wrong); an invalid
variant gives the proposer 0 and is not played (an early exit). Rewards pass through the reward group as the
score `correct`. Math tasks only: the variant is checked by the agent, not by the env.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import asdict
from fractions import Fraction
from typing import Any

from agentrl.agents.base import SessionPool, agent_config, parse_roles, task_prompts, with_role
from agentrl.agents.chat import role_turn
from agentrl.agents.demos import Demonstration, assistant, split_transcript, teacher_answer, with_answer
from agentrl.agents.record import Play, Rollout
from agentrl.answers import extract_answer, to_number, verify_answer
from agentrl.config.agent import AdversarialAgentConfig
from agentrl.http import async_client

ROLES = ("proposer", "solver")
# The parsing contract of this pattern, appended to the proposer's configured prompt.
PROPOSER_FORMAT = ("Write the new problem inside <problem>...</problem> and its exact value as an arithmetic "
                   "expression inside <expression>...</expression> (numbers, + - * / % ** and parentheses).")
_TAG = {t: re.compile(rf"<{t}>(.*?)</{t}>", re.S | re.I) for t in ("problem", "expression")}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_SYMBOLS = {"×": "*", "·": "*", "÷": "/", "−": "-", "–": "-", "^": "**"}
MAX_MAGNITUDE = 10**15
# An arithmetic expression written in a problem's text ("11 × 2 − 3", "7^5 mod 13"): the warm start's variants.
_WRITTEN = re.compile(r"\d+(?:\s*(?:[-+*/×÷−–^]|\bmod\b)\s*\d+)+")


class InvalidProblem(ValueError):
    """A proposed variant that cannot be verified."""


def python_ops(expression: str) -> str:
    """`expression` with written operators (×, ÷, −, ^, mod) as Python's."""
    text = expression.strip()
    for symbol, op in _SYMBOLS.items():
        text = text.replace(symbol, op)
    return re.sub(r"\bmod\b", "%", text)


def evaluate(expression: str) -> int:
    """The exact integer value of an arithmetic expression; InvalidProblem for anything else."""
    text = python_ops(expression)
    if not text or len(text) > 500:
        raise InvalidProblem("the expression is empty or too long")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise InvalidProblem(f"not an arithmetic expression: {exc.msg}") from None

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and (b.denominator != 1 or not 0 <= b <= 64 or abs(a) > 10**6):
                raise InvalidProblem("powers need a whole exponent 0..64 and a base up to 10^6")
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
                raise InvalidProblem("division by zero")
            out = _OPS[type(node.op)](a, b)
            if abs(out) > MAX_MAGNITUDE:
                raise InvalidProblem("the value is too large")
            return Fraction(out)
        raise InvalidProblem(f"{type(node).__name__} is not allowed in an arithmetic expression")

    result = value(tree.body)
    if result.denominator != 1:
        raise InvalidProblem(f"the expression's value {result} is not an integer")
    return int(result)


def parse_variant(text: str) -> tuple[str, int]:
    """(problem, integer label) of a proposer's reply; InvalidProblem when it is not valid and verifiable."""
    problem = _TAG["problem"].findall(text or "")
    expression = _TAG["expression"].findall(text or "")
    if not problem or not problem[-1].strip():
        raise InvalidProblem("no <problem>...</problem>")
    if not expression:
        raise InvalidProblem("no <expression>...</expression>")
    label = evaluate(expression[-1])
    stated = extract_answer(_TAG["problem"].sub("", text))
    if stated is not None and to_number(stated) is not None and to_number(stated) != label:
        raise InvalidProblem(f"the stated answer {stated} is not the expression's value {label}")
    return problem[-1].strip(), label


def numbers_variant(task: str, label: str, rng: Any) -> tuple[str, str, int] | None:
    """(variant task, its expression, its value): `task` with the numbers of the arithmetic expression it
    states changed, when that expression's value is `label` (so it is the question, not part of it) and a
    draw of new numbers keeps the value an integer; else None."""
    found = list(_WRITTEN.finditer(task))
    if not found:
        return None
    written = found[-1]
    try:
        if to_number(label) != evaluate(written.group()):
            return None
    except InvalidProblem:
        return None
    for _ in range(20):
        text = re.sub(r"\d+", lambda m: str(rng.randint(max(1, int(m.group()) // 2), int(m.group()) * 2 + 2)),
                      written.group())
        if text == written.group():
            continue
        try:
            value = evaluate(text)
        except InvalidProblem:
            continue
        return task[:written.start()] + text + task[written.end():], python_ops(text), value
    return None


class AdversarialAgent:
    """Plays one row as a proposer rollout and, for a valid variant, a solver rollout, each scored `correct`
    for its side."""

    def __init__(self, **config: Any) -> None:
        self.settings = agent_config(AdversarialAgentConfig, config)
        defaults = [asdict(r) for r in AdversarialAgentConfig().roles]
        self.roles = parse_roles(self.settings.roles, ROLES, defaults)

    def proposer_messages(self, task: str) -> list[dict[str, Any]]:
        """The proposer's conversation: its instructions and the parsing contract, then the row's task."""
        prompt = "\n\n".join(p for p in (self.roles["proposer"].prompt, PROPOSER_FORMAT) if p)
        return [{"role": "system", "content": prompt}, {"role": "user", "content": task}]

    def solver_messages(self, system: str, problem: str) -> list[dict[str, Any]]:
        """The solver's conversation on a (variant) problem."""
        return [{"role": "system", "content": with_role(system, self.roles["solver"])},
                {"role": "user", "content": problem}]

    def demonstration_options(self) -> dict[str, Any]:
        """What changes `demonstrations`: part of the SFT warm start's cache key."""
        return {"pattern": "adversarial", "roles": {n: self.roles[n].prompt for n in ROLES}}

    def demonstrations(self, transcript: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       rng: Any) -> list[Demonstration]:
        """The warm start's role turns for a bundle demonstration (both roles play tool-less): the solver
        answers the task as the teacher did; when the task states its arithmetic (arith), the proposer writes
        the task with new numbers and that expression, and the solver answers the variant."""
        system, task, turns = split_transcript(transcript)
        answer = teacher_answer(turns)
        if answer is None:
            return []
        out = [Demonstration([*self.solver_messages(system, task), *with_answer(turns, answer)])]
        variant = numbers_variant(task, answer, rng)
        if variant is not None:
            problem, expression, value = variant
            out.append(Demonstration([*self.proposer_messages(task),
                                      assistant(f"<problem>{problem}</problem>\n<expression>{expression}</expression>")]))
            out.append(Demonstration([*self.solver_messages(system, problem), *with_answer(turns, str(value))]))
        return out

    async def play(self, sessions: SessionPool, row: dict[str, Any], *, request_kwargs: dict[str, Any]) -> Play:
        system, task = task_prompts(row)
        proposer, solver = (self.roles[n] for n in ROLES)
        play_id = Rollout().play_id
        s = self.settings
        turn_kw = {"request_kwargs": request_kwargs, "max_response_tokens": s.max_response_tokens,
                   "max_context_tokens": s.max_context_tokens, "timeout": s.model_timeout}
        p_rec = proposer.stamp(Rollout(base_url=await sessions.open(proposer.name)), play_id)
        async with async_client() as client:
            reply = await role_turn(client, p_rec.base_url, self.proposer_messages(task), p_rec, **turn_kw)
            try:
                if reply is None:
                    raise InvalidProblem("the proposer gave no reply")
                problem, label = parse_variant(reply.content)
            except InvalidProblem as exc:  # not played: the proposer scores nothing (an early exit)
                p_rec.details.update(valid=False, invalid_reason=str(exc))
                p_rec.early_exit = True
                return Play([p_rec])
            s_rec = solver.stamp(Rollout(base_url=await sessions.open(solver.name)), play_id)
            answer = await role_turn(client, s_rec.base_url, self.solver_messages(system, problem), s_rec,
                                     **turn_kw)
        for record in (p_rec, s_rec):
            record.details.update(valid=True, problem=problem, label=label)
        if answer is None:  # no fair contest: neither side earns anything
            p_rec.flag(s_rec.failure, s_rec.error)
            p_rec.early_exit = s_rec.early_exit = True
            return Play([p_rec, s_rec])
        solved = float(verify_answer(answer.content, str(label)))
        for record, score in ((p_rec, 1.0 - solved), (s_rec, solved)):
            record.scores = {"correct": score}
            record.answer = answer.content
            record.details["solved"] = bool(solved)
        return Play([p_rec, s_rec])
