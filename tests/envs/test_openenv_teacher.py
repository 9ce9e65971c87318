"""The documented OpenEnv example can learn: its teacher (`env.teacher`, a scripted policy) plays the remote
server for the warm start's demonstrations, and the recipe's warm start trains on them (a real OpenEnv
server; the recipe through the real CLI)."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.openenv_remote.example import GuessEnv
from agentrl.envs.server import serve_in_background
from agentrl.testing.cli import run_agentrl
from agentrl.trainers.sft.demonstrations import encode_demonstrations

TEACHER = "agentrl.envs.bundles.openenv_remote.example:bisect"


class RecordedGuessEnv(GuessEnv):
    """The example env, keeping (secret, the guesses the server was sent, won) of every session it served."""

    lock = threading.Lock()
    plays: list[dict[str, Any]] = []

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any):
        observation = super().reset(seed=seed, episode_id=episode_id, **kw)
        self.play = {"secret": self.secret, "guesses": []}
        with RecordedGuessEnv.lock:
            RecordedGuessEnv.plays.append(self.play)
        return observation

    async def step_async(self, action: Any, timeout_s: float | None = None, **kw: Any):
        observation = await super().step_async(action, timeout_s=timeout_s, **kw)
        if isinstance(action, CallToolAction):
            self.play["guesses"].append(action.arguments.get("number"))
            self.play["won"] = self.won
        return observation


def test_the_teachers_demonstrations_are_real_plays_of_the_server_that_win() -> None:
    app = create_app(RecordedGuessEnv, CallToolAction, CallToolObservation, max_concurrent_envs=4)
    with serve_in_background(app) as url:
        bundle = load_bundle("openenv", url=url, train_size=16, eval_size=4, teacher=TEACHER)
        assert bundle.teachers == ("bisect",)
        RecordedGuessEnv.plays.clear()
        transcripts = [bundle.demonstration("train", i, "bisect") for i in range(16)]
        plays = [p for p in RecordedGuessEnv.plays if p["guesses"]]
    assert len(plays) == 16  # one server session per demonstration, each reset and played
    secrets = set()
    for transcript, play in zip(transcripts, plays, strict=True):
        calls = [m["tool_calls"][0]["function"] for m in transcript if m["role"] == "assistant"]
        sent = [int(c["arguments"].split(":")[1].strip(" }")) for c in calls]
        assert sent == play["guesses"], (transcript, play)  # the transcript's calls are what the server got
        assert play["won"] and sent[-1] == play["secret"] and len(sent) <= 4  # bisection: found in <= 4
        answers = [m["content"] for m in transcript if m["role"] == "tool"]
        assert answers == ["higher" if g < play["secret"] else "lower" for g in sent[:-1]]  # the server's words
        assert transcript[1]["content"] == "Find the hidden number between 1 and 8 with the guess tool."
        assert transcript[-1]["role"] == "assistant"  # the winning call ends it, as the agent's episode ends
        secrets.add(play["secret"])
    assert secrets == set(range(1, 9))  # every number of the game, each found


def test_a_teacher_is_named_and_checked(tmp_path: Path) -> None:
    app = create_app(GuessEnv, CallToolAction, CallToolObservation, max_concurrent_envs=2)
    with serve_in_background(app) as url:
        plain = load_bundle("openenv", url=url, train_size=2, eval_size=1)
        assert plain.teachers == ()
        with pytest.raises(ValueError, match="env.teacher=package.module:function"):
            plain.demonstration("train", 0, "bisect")
        for spec, says in (("bisect", "package.module:function"), ("agentrl.nowhere:bisect", "cannot import"),
                           ("agentrl.envs.bundles.openenv_remote.example:nothing", "no callable 'nothing'")):
            with pytest.raises(ValueError, match=says):
                load_bundle("openenv", url=url, train_size=2, eval_size=1, teacher=spec)
        wrong = load_bundle("openenv", url=url, train_size=2, eval_size=1,
                            teacher="agentrl.envs.bundles.openenv_remote.example:GuessEnv")  # callable, not a policy
        with pytest.raises((ValueError, TypeError)):
            wrong.demonstration("train", 0, "GuessEnv")


def test_a_served_example_is_played_and_keys_its_data_by_the_app() -> None:
    spec = "agentrl.envs.bundles.openenv_remote.example:app"
    one = load_bundle("openenv", serve=spec, train_size=2, eval_size=1, teacher=TEACHER)
    two = load_bundle("openenv", serve=spec, train_size=2, eval_size=1, teacher=TEACHER)
    assert one.url != two.url  # two servers, each on a free port
    transcript = one.demonstration("eval", 0, "bisect")  # eval seed 2: the number 3, found by 4, 2, 3
    assert [m["content"] for m in transcript if m["role"] == "tool"] == ["lower", "higher"]
    # The warm start's cache key holds the app, not the port it happened to get: a second run reuses it.
    assert one.data_options() == two.data_options() and one.data_options()["url"] == f"serve:{spec}"
    assert one.spec()["url"] == one.url  # rebuilt elsewhere, the bundle plays this server
    with pytest.raises(ValueError, match="env.serve="):
        load_bundle("openenv", serve="agentrl.envs.bundles.openenv_remote.example:nothing", train_size=2, eval_size=1)
    with pytest.raises(ValueError, match="env.url is not set"):
        load_bundle("openenv", train_size=2, eval_size=1)


def test_the_demonstrations_encode_for_sft(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from agentrl.testing.tiny_models import shared_tiny_model

    app = create_app(GuessEnv, CallToolAction, CallToolObservation, max_concurrent_envs=2)
    with serve_in_background(app) as url:
        bundle = load_bundle("openenv", url=url, train_size=8, eval_size=1, teacher=TEACHER)
        tokenizer = AutoTokenizer.from_pretrained(shared_tiny_model())
        encoded = encode_demonstrations(tokenizer, bundle, "train", "bisect")
    assert len(encoded) == 8
    for ids, mask in encoded:
        assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)  # the assistant's guesses, not the prompts
    longest = max(sum(mask) for _, mask in encoded)
    shortest = min(sum(mask) for _, mask in encoded)
    assert longest > shortest  # four guesses' tokens against one: every turn of the play is trained on


@pytest.mark.slow  # an SFT warm start and one GRPO step of the tiny model: ~2-3 min on a loaded 2-core box
def test_the_recipes_warm_start_learns_the_remote_env(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # The recipe as shipped: it serves the example (OpenEnv's app) itself, on a free port (env.serve).
    done = run_agentrl(["+recipe=openenv_guess", "trainer.steps=1", "trainer.eval_limit=16"], home, timeout=1200,
                       check=False).process
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "warm start: SFT on bisect demonstrations" in out
    warm = float(re.search(r"warm_start/eval/reward ([\d.]+)", out).group(1))
    final = float(re.search(r"final eval/grade\s+([\d.]+)", out).group(1))
    # The untrained model finds nothing (benchmarks/RESULTS.md, "The OpenEnv example learns": 0 of 32);
    # the warm start on the teacher's plays finds most numbers.
    assert warm >= 0.5, out[-4000:]
    assert final > 0, out[-4000:]
    # The served MCP app logs a line per request at INFO; the run's console (and log) keeps to its own lines.
    assert "Processing request of type" not in out
