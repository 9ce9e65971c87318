"""SFT's data: a bundle's demonstrations as chats, then as (token ids, assistant mask) pairs.

The split's tasks (and their `augment` variants) are encoded up front; the `generated` tasks a bundle makes
beyond its packs are encoded when SFT first draws one (`GeneratedDemonstrations`): a short warm start of a
recipe that asks for 48,000 of them tokenizes only the few it trains on, and a long one only those drawn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.inference.assistant_tokens import TemplateError, encode_assistant_turns

Chat = tuple[list[dict[str, Any]], Any]  # (messages, tools)
Encoded = tuple[list[int], list[int]]  # (token ids, assistant mask)


def role_demonstrations(agent: Any) -> bool:
    """True when the agent makes its own role demonstrations (a multi-agent pattern's `demonstrations`)."""
    return callable(getattr(agent, "demonstrations", None))


def demonstration_chats(bundle: Any, split: str, index: int, teacher: str, augment: int = 0, seed: int = 0,
                        agent: Any = None) -> list[Chat]:
    """(messages, tools) of every chat task `index` contributes to SFT: the bundle's demonstration and its
    `augment` variants (drawn with a generator seeded by `seed` and the task's index: reproducible), each as
    the single agent plays it, or, for an agent with roles (`role_demonstrations`), as the agent's role turns
    with the teacher's answer (`agent.demonstrations`, rendered with the tools that role is sent)."""
    rng = random.Random(f"{seed}/{split}/{index}")
    transcripts = [bundle.demonstration(split, index, teacher)]
    transcripts += [bundle.demonstration_variant(split, index, teacher, rng) for _ in range(augment)]
    return _as_chats(transcripts, _tools(bundle, split, index), agent, rng)


def generated_chats(bundle: Any, index: int, teacher: str, seed: int = 0, agent: Any = None,
                    tools: Any = None) -> list[Chat]:
    """(messages, tools) of generated task `index` (`Bundle.generated_demonstration`), as `demonstration_chats`."""
    transcript = bundle.generated_demonstration(index, teacher, seed)
    return _as_chats([transcript], tools, agent, random.Random(f"{seed}/generated/{index}"))


def _tools(bundle: Any, split: str, index: int) -> Any:
    return getattr(bundle, "tools", None) or bundle.episode(split, index).first_turn().tools or None


def _as_chats(transcripts: list[list[dict[str, Any]]], tools: Any, agent: Any, rng: random.Random) -> list[Chat]:
    if not role_demonstrations(agent):
        return [(messages, tools) for messages in transcripts]
    return [(d.messages, d.tools or None) for t in transcripts for d in agent.demonstrations(t, tools, rng)]


def encode_chat(tokenizer: Any, chat: Chat, name: str) -> Encoded:
    """One chat rendered by the model's chat template, cut after its last assistant token (any template:
    `inference.assistant_tokens`)."""
    messages, tools = chat
    try:
        return encode_assistant_turns(tokenizer, messages, tools)
    except TemplateError as exc:
        raise ValueError(f"demonstration {name}: {exc}") from exc


class GeneratedDemonstrations(Sequence):
    """The encoded chats of generated tasks 0..count-1, each task made and encoded on first access, then kept.

    Every task must give as many chats as task 0 (one for a single agent; a pattern's fixed set of role turns):
    the index of a chat is then `task * per_task + j`, known without making the tasks before it.
    """

    def __init__(self, make: Callable[[int], list[Chat]], encode: Callable[[Chat, str], Encoded], count: int) -> None:
        self._make, self._encode, self._count = make, encode, count
        self._done: dict[int, list[Encoded]] = {}
        self.per_task = len(self._task(0)) if count else 0

    def _task(self, task: int) -> list[Encoded]:
        got = self._done.get(task)
        if got is None:
            chats = self._make(task)
            if self._done and len(chats) != self.per_task:
                raise ValueError(f"generated task {task} gives {len(chats)} demonstration chats, task 0 gave "
                                 f"{self.per_task}: generated demonstrations need a fixed number per task")
            got = self._done[task] = [self._encode(c, f"generated/{task}") for c in chats]
        return got

    @property
    def encoded(self) -> int:
        """Tasks made and encoded so far."""
        return len(self._done)

    def __len__(self) -> int:
        return self._count * self.per_task

    def __getitem__(self, i: int) -> Encoded:  # type: ignore[override]  # ints only: SFT draws one at a time
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        task, j = divmod(i % len(self), self.per_task)
        return self._task(task)[j]


class Demonstrations(Sequence):
    """The split's encoded demonstrations, then the generated ones (`GeneratedDemonstrations`), as one sequence."""

    def __init__(self, stored: list[Encoded], generated: Sequence[Encoded] = ()) -> None:
        self.stored, self.generated = stored, generated

    def __len__(self) -> int:
        return len(self.stored) + len(self.generated)

    def __getitem__(self, i: int) -> Encoded:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.stored[i] if i < len(self.stored) else self.generated[i - len(self.stored)]


def demonstration_data(tokenizer: Any, bundle: Any, split: str, teacher: str, limit: int | None = None,
                       augment: int = 0, seed: int = 0, agent: Any = None, generated: int = 0) -> Demonstrations:
    """SFT's data: the chats of each task of `split` (`demonstration_chats`, encoded now), then those of
    `generated` generated tasks (`generated_chats`, encoded when first drawn)."""
    if generated < 0:
        raise ValueError(f"trainer.generated must be >= 0 (extra generated demonstrations), got {generated}")
    count = bundle.splits()[split] if limit is None else min(limit, bundle.splits()[split])
    stored = [encode_chat(tokenizer, chat, f"{split}/{i}") for i in range(count)
              for chat in demonstration_chats(bundle, split, i, teacher, augment, seed, agent)]
    if not generated:
        return Demonstrations(stored)
    tools = _tools(bundle, split, 0)
    lazy = GeneratedDemonstrations(lambda i: generated_chats(bundle, i, teacher, seed, agent, tools),
                                   lambda chat, name: encode_chat(tokenizer, chat, name), generated)
    return Demonstrations(stored, lazy)


def encode_demonstrations(tokenizer: Any, bundle: Any, split: str, teacher: str, limit: int | None = None,
                          augment: int = 0, seed: int = 0, agent: Any = None, generated: int = 0) -> list[Encoded]:
    """`demonstration_data`, every item encoded, as a list."""
    return list(demonstration_data(tokenizer, bundle, split, teacher, limit, augment, seed, agent, generated))
