"""Fixtures for the Miles and SGLang tests: a stand-in SGLang server and the tiny local model.

The stand-in answers the SGLang routes agentrl and Miles use, over real HTTP, in SGLang's response
shapes: `/v1/chat/completions` with `meta_info.output_token_logprobs` (Miles' fork, honouring the
request's `input_ids`), `/generate`, `/update_weights_from_disk`, the LoRA adapter and weight-version routes,
`/flush_cache`, `/workers` and
`/abort_request` (the router's). Replies come from a `policy(messages) -> dict`; the output token ids
are the tokenizer's ids for the assistant turn exactly as the chat template renders it, so Miles' TITO
bookkeeping sees what a real model producing that text would produce.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from agentrl.config.env import GridSimEnvConfig
from agentrl.config.inference import SGLangInferenceConfig
from agentrl.config.model import HFModelConfig
from agentrl.config.reward import EnvScoreRewardConfig
from agentrl.config.schema import RunConfig
from agentrl.config.trainer import MilesTrainerConfig
from agentrl.envs.server import serve_in_background
from agentrl.trainers.miles.args import LaunchContext

IM_END = "<|im_end|>"


def assistant_token_ids(tokenizer: Any, messages: list[dict], tools: list | None, reply: dict) -> list[int]:
    """The ids of the assistant turn `reply` as the chat template renders it after `messages` (ends at <|im_end|>)."""
    assistant = {"role": "assistant", "content": reply.get("content") or "", "tool_calls": reply.get("tool_calls")}
    prefix = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*messages, assistant], tools=tools, tokenize=False)
    assert full.startswith(prefix), "the chat template is not prefix-stable"
    body = full[len(prefix):]
    body = body[: body.rindex(IM_END) + len(IM_END)]
    return tokenizer.encode(body, add_special_tokens=False)


def logprob_of(position: int) -> float:
    """A deterministic, position-dependent sampling logprob the tests can check for."""
    return -0.125 * (1 + position % 4)


class StandInSGLang:
    """The app plus a log of every call (path, JSON body), in order."""

    def __init__(self, tokenizer: Any = None, policy: Callable[[list[dict]], dict] | None = None,
                 generate_ids: list[int] | None = None, stop_id: int | None = None) -> None:
        self.tokenizer, self.policy = tokenizer, policy
        self.generate_ids = generate_ids or [5, 6, 7]
        self.stop_id = stop_id
        self.calls: list[tuple[str, dict]] = []
        self.weight_version = "0"
        self.url = ""
        self.in_flight = 0
        self.generate_delay = 0.0
        self.fail_update = False
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict:
            return {}

        @app.get("/workers")
        async def workers() -> dict:
            return {"workers": [{"url": self.url}]}

        @app.post("/abort_request")
        async def abort(request: Request) -> dict:
            self.calls.append(("/abort_request", await request.json()))
            return {}

        @app.post("/flush_cache")
        async def flush() -> dict:
            self.calls.append(("/flush_cache", {}))
            return {}

        @app.post("/update_weights_from_disk")
        async def update(request: Request) -> dict:
            body = await request.json()
            self.calls.append(("/update_weights_from_disk", {**body, "in_flight": self.in_flight}))
            if self.fail_update:
                return {"success": False, "message": "stand-in refused the weights"}
            self.weight_version = str(body.get("weight_version") or int(self.weight_version) + 1)
            return {"success": True, "message": "loaded", "num_paused_requests": 0}

        # SGLang's adapter and version routes (sglang/srt/entrypoints/http_server.py): what update_adapter calls.
        @app.post("/load_lora_adapter")
        async def load_lora(request: Request) -> dict:
            body = await request.json()
            self.calls.append(("/load_lora_adapter", {**body, "in_flight": self.in_flight,
                                                      "files": sorted(p.name for p in Path(body["lora_path"]).iterdir())}))
            return {"success": True, "loaded_adapters": {body["lora_name"]: body["lora_path"]}}

        @app.post("/unload_lora_adapter")
        async def unload_lora(request: Request) -> dict:
            self.calls.append(("/unload_lora_adapter", await request.json()))
            return {"success": True}

        @app.post("/update_weight_version")
        async def set_version(request: Request) -> dict:
            body = await request.json()
            self.calls.append(("/update_weight_version", body))
            self.weight_version = body["new_version"]
            return {"success": True, "new_version": self.weight_version}

        @app.get("/model_info")
        async def model_info() -> dict:
            return {"weight_version": self.weight_version}

        @app.post("/generate")
        async def generate(request: Request) -> dict:
            body = await request.json()
            self.calls.append(("/generate", body))
            self.in_flight += 1
            try:
                await asyncio.sleep(self.generate_delay)
                limit = int(body["sampling_params"].get("max_new_tokens") or len(self.generate_ids))
                ids = self.generate_ids[:limit]
                stopped = self.stop_id is not None and len(ids) < limit
                if stopped:
                    ids = [*ids, self.stop_id]
                finish = {"type": "stop", "matched": self.stop_id} if stopped else {"type": "length", "length": limit}
                return {"text": "", "output_ids": ids, "meta_info": {
                    "id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": self.weight_version,
                    "output_token_logprobs": [[logprob_of(i), t, None] for i, t in enumerate(ids)]}}
            finally:
                self.in_flight -= 1

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> dict:
            body = await request.json()
            self.calls.append(("/v1/chat/completions", body))
            messages, tools = body["messages"], body.get("tools")
            reply = self.policy(messages)
            ids = assistant_token_ids(self.tokenizer, messages, tools, reply)
            finish = reply.get("finish_reason") or ("tool_calls" if reply.get("tool_calls") else "stop")
            message = {"role": "assistant", "content": reply.get("content") or "",
                       "tool_calls": reply.get("tool_calls"), "reasoning_content": None}
            usage = {"prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids),
                     "total_tokens": len(body["input_ids"]) + len(ids)}
            return {"id": uuid.uuid4().hex, "object": "chat.completion", "model": "stand-in", "usage": usage,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "meta_info": {
                        "output_token_logprobs": [[logprob_of(i), t] for i, t in enumerate(ids)],
                        "completion_tokens": len(ids), "prompt_tokens": len(body["input_ids"]),
                        "cached_tokens": 0, "weight_version": self.weight_version}}]}

        return app

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]


@pytest.fixture
def stand_in_sglang() -> Iterator[Callable[..., StandInSGLang]]:
    """`start(**kwargs)` serves a StandInSGLang on a loopback port; all are stopped after the test."""
    managers = []

    def start(**kwargs: Any) -> StandInSGLang:
        server = StandInSGLang(**kwargs)
        cm = serve_in_background(server.app)
        server.url = cm.__enter__()
        managers.append(cm)
        return server

    yield start
    for cm in reversed(managers):
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """The tiny Qwen3-architecture model (made locally once, then reused from a cache folder)."""
    from agentrl.models.tiny import BUILDER_VERSION, ensure_tiny_model

    root = Path(os.environ.get("AGENTRL_TEST_MODELS", Path.home() / ".cache" / "agentrl-test-models"))
    return ensure_tiny_model(str(root / f"tiny-b{BUILDER_VERSION}-s0-h128-l4-v2048"))


def tool_call(name: str, arguments: dict, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


# -- trainer=miles configs and launch arguments, for the mapping tests and the rollout tests

def make_settings(**trainer: Any) -> RunConfig:
    """A trainer=miles run's typed settings (what `Plan.settings` holds: Qwen3-4B path, SGLang inference) with
    `trainer` settings overridden."""
    return RunConfig(trainer=MilesTrainerConfig(**trainer), inference=SGLangInferenceConfig(),
                     env=GridSimEnvConfig(), model=HFModelConfig(path="/m/Qwen3-4B"), reward=EnvScoreRewardConfig(),
                     seed=7)


def ctx(tmp_path: Path, **kw: Any) -> LaunchContext:
    """A launch context with rows and checkpoints under `tmp_path`."""
    return LaunchContext(rows={"train": tmp_path / "train.jsonl", "eval": tmp_path / "eval.jsonl"},
                         save_dir=tmp_path / "ckpt", tracking_uri="http://mlflow:5000", experiment="exp",
                         run_id="run123", pythonpath="/repo", **kw)


def flags(argv: list[str]) -> dict[str, list[str]]:
    """flag -> its values (a bare flag maps to [])."""
    out, key = {}, None
    for a in argv:
        if a.startswith("--"):
            key = a
            out[key] = []
        else:
            out[key].append(a)
    return out
