"""vLLM's token-in/token-out route, `/inference/v1/generate`: what one call sends (`sampling_params`) and what its
answer becomes (`to_completion`: ids, logprobs and the weight version of every token)."""

from __future__ import annotations

from typing import Any

from agentrl.inference.engines.completion import Completion
from agentrl.inference.engines.vllm.servers import VLLMError


def sampling_params(max_tokens: int, temperature: float, top_p: float, top_k: int, stop_ids: list[int],
                    seed: int | None, ignore_eos: bool) -> dict[str, Any]:
    """vLLM's SamplingParams for one call: the sampled token's logprob back, stop tokens kept in the output."""
    params: dict[str, Any] = {"max_tokens": int(max_tokens), "temperature": float(temperature), "top_p": float(top_p),
                              "top_k": int(top_k) if top_k and top_k > 0 else 0, "ignore_eos": bool(ignore_eos),
                              "logprobs": 0, "skip_special_tokens": False, "detokenize": False}
    if stop_ids:
        params["stop_token_ids"] = [int(s) for s in stop_ids]
    if seed is not None:
        params["seed"] = int(seed) % (1 << 63)  # the session server takes any 64-bit seed; vLLM a non-negative one
    return params


def to_completion(body: dict[str, Any], url: str, prompt_tokens: int) -> Completion:
    """A `Completion` from `/inference/v1/generate`'s answer (choices[0]: token_ids, logprobs, weight_versions)."""
    try:
        choice = body["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or []]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise VLLMError(f"{url}/inference/v1/generate answered no token ids and logprobs: {str(body)[:300]}") from exc
    if len(logprobs) != len(ids):
        raise VLLMError(f"{url} returned {len(ids)} tokens but {len(logprobs)} logprobs")
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise VLLMError(f"{url} ended a generation with finish_reason={reason!r}")
    per_token = token_versions(choice.get("weight_versions") or [], len(ids), url)
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=reason,
                      weight_version=per_token[0] if per_token else 0, prompt_tokens=prompt_tokens,
                      token_versions=per_token if len(set(per_token)) > 1 else [])


def token_versions(spans: list[Any], n: int, url: str) -> list[int]:
    """One weight version per output token from vLLM's spans (`{version, start, end}` over output-token indexes;
    labels that are not ours, such as vLLM's "default", count as 0). [] for a reply without spans. A reply spans
    several versions only through a kept push (partial rollouts), which only moves forward: spans that leave a
    gap, overlap or go back are a server changed behind our back."""
    out: list[int] = []
    for span in spans:
        try:
            label, start, end = str(span.get("version", "")), int(span["start"]), int(span["end"])
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise VLLMError(f"{url} answered a weight-version span that is not one: {str(span)[:200]}") from exc
        version = int(label) if label.isdigit() else 0
        if start != len(out) or end < start or (out and version < out[-1]):
            raise VLLMError(f"{url} sampled one reply with weight-version spans {str(spans)[:300]}")
        out += [version] * (end - start)
    if out and len(out) < n:  # tokens past the last span's end: still the last version's
        out += [out[-1]] * (n - len(out))
    return out[:n]
