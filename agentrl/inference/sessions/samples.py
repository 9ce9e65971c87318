"""Samples for trainers (token ids, loss mask, rollout logprobs, reward, group), assembled from the records a
token-in/token-out session server keeps of a session's turns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One trajectory as a trainer sees it.

    `loss_mask[i]` is 1 exactly where the model sampled `token_ids[i]`; `rollout_logprobs[i]` is that
    token's sampling logprob, log_softmax(logits / T), and 0.0 wherever the mask is 0.
    `turn_boundaries` holds one `(start, end)` slice of `token_ids` per model turn.
    `metadata` (from `assemble_sample`): `weight_versions` (per turn, the version of its first token),
    `first_weight_version` (the sample's first sampled token's: staleness counts from it) and
    `resumed_turns` (turns sampled by more than one version: a push in keep mode landed inside them).
    """

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    reward: float | None = None
    group_id: int | str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    turn_boundaries: list[tuple[int, int]] = field(default_factory=list)

    @property
    def prompt_length(self) -> int:
        """Tokens before the first model turn."""
        return self.turn_boundaries[0][0] if self.turn_boundaries else len(self.token_ids)

    @property
    def response_length(self) -> int:
        """Tokens from the first model turn to the end (model tokens and everything between them)."""
        return len(self.token_ids) - self.prompt_length


def is_resumed(sample: Sample) -> bool:
    """Whether a push in keep mode landed inside one of the sample's turns (a resumed partial rollout)."""
    return int(sample.metadata.get("resumed_turns", 0)) > 0


def _turn(record: dict[str, Any], i: int) -> tuple[list[int], list[int], list[float], dict[str, Any]]:
    try:
        prompt = [int(t) for t in record["request"]["input_ids"]]
        choice = record["response"]["choices"][0]
        pairs = choice["meta_info"]["output_token_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"record {i} is not a session-server chat completion record (missing {exc})") from exc
    return prompt, [int(t) for _, t in pairs], [float(lp) for lp, _ in pairs], choice


def assemble_sample(session_records: list[dict[str, Any]] | dict[str, Any], *, reward: float | None = None,
                    group_id: int | str | None = None, metadata: dict[str, Any] | None = None) -> Sample:
    """Join a session's turns into one Sample.

    `session_records` is the `records` list of `GET /sessions/{id}` (or that whole response). Each
    turn's prompt must start with everything before it (the server guarantees this); the tokens it
    adds (tool results, user messages, chat scaffolding) get mask 0, the model's tokens mask 1.
    """
    if isinstance(session_records, dict):
        session_records = session_records.get("records", [])
    records = [r for r in session_records if r.get("path", "/v1/chat/completions").endswith("/chat/completions")]
    if not records:
        raise ValueError("the session has no chat completion records to assemble")
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    bounds: list[tuple[int, int]] = []
    finish: list[str] = []
    versions: list[Any] = []
    resumed = 0  # turns whose tokens were sampled by more than one weight version (a push in keep mode)
    for i, record in enumerate(records):
        prompt, out, lps, choice = _turn(record, i)
        if prompt[: len(tokens)] != tokens:
            at = next((j for j, (a, b) in enumerate(zip(prompt, tokens, strict=False)) if a != b), len(prompt))
            raise ValueError(f"record {i}'s prompt does not extend the earlier turns (first difference at token {at})")
        added = prompt[len(tokens):]
        tokens += added + out
        mask += [0] * len(added) + [1] * len(out)
        logprobs += [0.0] * len(added) + lps
        bounds.append((len(tokens) - len(out), len(tokens)))
        finish.append(choice.get("finish_reason"))
        version = choice["meta_info"].get("weight_version")
        versions.append(version)
        per_token = choice["meta_info"].get("token_weight_versions") or [version] * len(out)
        resumed += int(len(set(per_token)) > 1)
    meta = {"finish_reasons": finish, "weight_versions": versions, "num_turns": len(records),
            "first_weight_version": versions[0], "resumed_turns": resumed}
    meta.update(metadata or {})
    return Sample(tokens, mask, logprobs, reward, group_id, meta, bounds)
