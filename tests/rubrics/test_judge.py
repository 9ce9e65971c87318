"""The LLM judge of `reward=rubric` against real HTTP endpoints: a local server that answers well, answers garbage,
answers slower than the timeout or not as OpenAI does (the thing outside, misbehaving on purpose), and our own
session server with the tiny model. A judge that gives no score flags the rollout `judge_error` instead of
scoring it 0; retries, the (prompt, answer) cache and the bound on requests in flight are counted."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentrl.agents.record import Failure, Play, Rollout
from agentrl.rewards import reward_play
from agentrl.rubrics import Judge, RubricReward, Score, WeightedSum

ROW = {"messages": [{"role": "user", "content": "What is 2+3?"}]}


class Endpoint:
    """A real OpenAI-shaped HTTP endpoint whose behaviour a test sets: `reply` (text), `status`, `body` (raw),
    `delay_s`, `replies`; it records every request and the most it ever served at once."""

    def __init__(self) -> None:
        self.reply, self.status, self.body, self.delay_s = "0.75", 200, None, 0.0
        self.replies: list[str] = []  # the replies of the next requests, in order, before `reply`
        self.requests: list[dict] = []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.requests.append(body)
                    reply = endpoint.replies.pop(0) if endpoint.replies else endpoint.reply
                    endpoint.in_flight += 1
                    endpoint.most_in_flight = max(endpoint.most_in_flight, endpoint.in_flight)
                try:
                    time.sleep(endpoint.delay_s)
                    raw = endpoint.body if endpoint.body is not None else json.dumps(
                        {"choices": [{"message": {"role": "assistant", "content": reply}}]})
                    data = raw.encode()
                    self.send_response(endpoint.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the judge gave up waiting (its timeout)
                finally:
                    with endpoint.lock:
                        endpoint.in_flight -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.close()


def judge_play(group: RubricReward, *answers: str, scores: dict[str, float] | None = None) -> list[Rollout]:
    play = Play([Rollout(scores=dict(scores or {"grade": 1.0}), answer=a) for a in answers])
    return asyncio.run(reward_play(group, play, ROW))


def test_a_judge_scores_the_answer_to_the_tasks_prompt_and_each_part_is_kept(endpoint):
    judge = Judge(url=endpoint.url, model="judge-model", retries=0)
    group = RubricReward(WeightedSum(parts={"grade": Score(name="grade"), "judge": judge},
                                     weights={"grade": 0.5, "judge": 0.5}))
    [r] = judge_play(group, "5", scores={"grade": 0.5})
    assert r.failure is None
    assert r.reward == pytest.approx(0.5 * 0.5 + 0.5 * 0.75)
    assert r.rubric == pytest.approx({"grade": 0.5, "judge": 0.75, "total": 0.625})
    [request] = endpoint.requests
    assert request["model"] == "judge-model" and request["temperature"] == 0.0
    assert "What is 2+3?" in request["messages"][0]["content"] and "5" in request["messages"][0]["content"]


@pytest.mark.parametrize("setup, named", [
    ({"reply": "I cannot rate this."}, "holds no score"),
    ({"body": "<html>busy</html>"}, "not JSON"),
    ({"body": json.dumps({"choices": []})}, "not an OpenAI chat completion"),
    ({"status": 500, "body": json.dumps({"error": "boom"})}, "HTTP 500"),
])
def test_a_judge_answering_garbage_flags_the_rollout_after_its_retries_instead_of_scoring_0(endpoint, setup, named):
    for key, value in setup.items():
        setattr(endpoint, key, value)
    group = RubricReward(Judge(url=endpoint.url, retries=2))
    [r] = judge_play(group, "5")
    assert r.failure == Failure.JUDGE_ERROR and named in r.error and endpoint.url in r.error
    assert (r.score, r.reward, r.rubric) == (0.0, 0.0, {})
    assert len(endpoint.requests) == 3  # one attempt and two retries
    assert group.metrics()["judge/failures"] == 1.0


def test_a_reply_given_as_a_tool_call_is_read_from_its_arguments(endpoint):
    endpoint.body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "rate", "arguments": json.dumps({"score": 0.4})}}]}}]})
    [r] = judge_play(RubricReward(Judge(url=endpoint.url, retries=0)), "5")
    assert (r.failure, r.reward) == (None, 0.4)


def test_a_judge_slower_than_its_timeout_flags_the_rollout(endpoint):
    endpoint.delay_s = 5.0
    group = RubricReward(Judge(url=endpoint.url, timeout_s=0.3, retries=1))
    [r] = judge_play(group, "5")
    assert r.failure == Failure.JUDGE_ERROR and "timeout_s=0.3" in r.error
    assert len(endpoint.requests) == 2


def test_a_judge_nobody_listens_to_flags_the_rollout(endpoint):
    url = endpoint.url
    endpoint.close()
    [r] = judge_play(RubricReward(Judge(url=url, retries=0)), "5")
    assert r.failure == Failure.JUDGE_ERROR and "ConnectError" in r.error


def test_a_judge_that_recovers_within_its_retries_scores(endpoint):
    endpoint.replies = ["no idea", "0.5"]
    [r] = judge_play(RubricReward(Judge(url=endpoint.url, retries=1)), "5")
    assert r.failure is None and r.reward == 0.5
    assert len(endpoint.requests) == 2


def test_the_cache_asks_each_prompt_and_answer_once_and_the_batch_bounds_requests_in_flight(endpoint):
    endpoint.delay_s = 0.2
    judge = Judge(url=endpoint.url, batch_size=2, retries=0)
    group = RubricReward(judge)
    answers = [f"answer {i % 4}" for i in range(12)]  # 4 distinct answers, asked 3 times each, all at once
    rollouts = judge_play(group, *answers)
    assert all(r.failure is None and r.reward == 0.75 for r in rollouts)
    assert len(endpoint.requests) == 4
    assert endpoint.most_in_flight <= 2
    judge_play(group, "answer 0")  # a later step: from the cache
    stats = group.metrics()
    assert len(endpoint.requests) == 4
    assert stats["judge/calls"] == 4.0
    assert stats["judge/cache_hit_rate"] == pytest.approx(9 / 13)
    assert stats["judge/calls_per_s"] > 0


def test_without_the_cache_every_answer_is_asked(endpoint):
    judge_play(RubricReward(Judge(url=endpoint.url, cache=False)), "a", "a", "a")
    assert len(endpoint.requests) == 3


@pytest.mark.parametrize("kwargs, named", [
    ({"url": "localhost:8000"}, "url='localhost:8000'"),
    ({"timeout_s": 0}, "timeout_s=0"),
    ({"retries": -1}, "retries=-1"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"prompt": "Rate {answr}"}, "{answr}"),
    ({"prompt": "Rate the task {prompt}"}, "{answer}"),
    ({"score_pattern": "(("}, "score_pattern='(('"),
])
def test_a_bad_judge_setting_is_refused_naming_it(kwargs, named):
    settings = {"url": "http://127.0.0.1:1", **kwargs}
    with pytest.raises(ValueError) as caught:
        Judge(**settings)
    assert named in str(caught.value)


@pytest.mark.slow
def test_our_session_server_with_the_tiny_model_is_a_judge():
    """The judge the proof trains with: every answer is judged (a score in [0, 1]) or flagged, never an error."""
    import torch

    from agentrl.inference.engines.embedded.engine import EmbeddedEngine
    from agentrl.inference.sessions.server import start_session_server
    from agentrl.testing.tiny_models import shared_tiny_model

    torch.set_num_threads(1)
    engine = EmbeddedEngine(shared_tiny_model())
    server = start_session_server(engine, default_max_tokens=16)
    try:
        group = RubricReward(Judge(url=server.base_url, session_server=True, retries=1, timeout_s=600))
        rollouts = judge_play(group, "submit_schedule {\"schedule\": [0, 1]}", "5", "five")
        for r in rollouts:
            assert r.failure in (None, Failure.JUDGE_ERROR), r.error
            assert 0.0 <= r.reward <= 1.0
            if r.failure is None:
                assert 0.0 <= r.rubric["total"] <= 1.0
        assert group.metrics()["judge/calls"] >= 3
        assert len(server.sessions) == 0  # every judge session was freed
    finally:
        server.stop()
        engine.close()
