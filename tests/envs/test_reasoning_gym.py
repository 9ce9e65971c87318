"""`env=reasoning_gym`: the real reasoning-gym library's tasks, seeds, scorers and curriculum."""

from __future__ import annotations

import httpx
import pytest
import reasoning_gym

from agentrl.agents.tool_calling import run
from agentrl.envs.bundles import load_bundle
from agentrl.envs.server import build_app, serve_in_background
from agentrl.testing import Reply, ScriptedChat, tool_call


def questions(bundle, split: str) -> list[str]:
    return [bundle.episode(split, i).first_turn().prompt for i in range(bundle.splits()[split])]


def answer_of(bundle, split: str, index: int) -> str:
    return str(bundle.episode(split, index).entry["answer"])


def test_splits_are_seeded_disjoint_and_sized_per_dataset():
    opts = {"datasets": {"chain_sum": {}, "leg_counting": {"eval_size": 4}}, "level": 0, "train_size": 60,
            "eval_size": 20}
    a, b = load_bundle("reasoning_gym", **opts), load_bundle("reasoning_gym", **opts)
    assert a.splits() == {"train": 120, "eval": 24}
    assert questions(a, "train") == questions(b, "train") and questions(a, "eval") == questions(b, "eval")
    # chain_sum at level 0 has ~200 distinct questions: 60 + 20 drawn from seeds collide unless skipped.
    assert not set(questions(a, "train")) & set(questions(a, "eval"))
    assert len(set(questions(a, "eval"))) == 24
    facts = [a.task_info("eval", i).extra["dataset"] for i in range(24)]
    assert facts.count("chain_sum") == 20 and facts.count("leg_counting") == 4
    assert a.eval_breakdown == {"dataset": "reward_{}"}
    other = load_bundle("reasoning_gym", **{**opts, "seed": 1})
    assert questions(other, "train") != questions(a, "train")


def test_answers_are_graded_by_reasoning_gyms_own_scorer():
    bundle = load_bundle("reasoning_gym", datasets={"word_sorting": {}}, train_size=4, eval_size=4)
    episode = bundle.episode("eval", 0)
    entry = episode.entry
    words = [w.strip() for w in entry["answer"].split(",")]
    partial = ", ".join(reversed(words))  # the scorer's own verdict on a wrong order
    expected = reasoning_gym.create_dataset("word_sorting", size=1, seed=0).score_answer(partial, entry)
    episode.call_tool("answer", {"answer": partial})
    assert episode.scores() == {"correct": expected} and expected < 1.0
    right = bundle.episode("eval", 0)
    right.call_tool("answer", {"answer": entry["answer"]})
    assert right.scores() == {"correct": 1.0}


@pytest.mark.parametrize(("mode", "reply", "score"), [
    ("tool", "Answer: {a}", 0.0),  # the tool was required
    ("text", "I add them.\nAnswer: {a}", 1.0),
    ("both", "<answer>{a}</answer>", 1.0),
    ("text", "Answer: none", 0.0),
])
def test_plain_final_text_is_the_answer_when_configured(mode: str, reply: str, score: float):
    bundle = load_bundle("reasoning_gym", datasets={"chain_sum": {}}, level=0, train_size=4, eval_size=4,
                         answer_mode=mode)
    episode = bundle.episode("eval", 1)
    assert [t["function"]["name"] for t in episode.first_turn().tools] == ([] if mode == "text" else ["answer"])
    episode.end_turn(reply.format(a=answer_of(bundle, "eval", 1)))
    assert episode.scores() == {"correct": score}


async def test_the_agent_answers_through_the_tool_over_the_env_server():
    bundle = load_bundle("reasoning_gym", datasets={"chain_sum": {}}, level=0, train_size=4, eval_size=4)
    chat = ScriptedChat([Reply(tool_calls=[tool_call("answer", {"answer": answer_of(bundle, "eval", 2)})])])
    with serve_in_background(build_app(bundle, max_concurrent_envs=2)) as env_url, chat.serve() as chat_url:
        sid = httpx.post(f"{chat_url}/sessions", trust_env=False).json()["session_id"]
        out = await run(f"{chat_url}/sessions/{sid}", None, {}, {"url": env_url, "split": "eval", "index": 2})
    assert out["reward"] == 1.0 and out["agentenv_scores"] == {"correct": 1.0}
    assert chat.requests[0]["messages"][1]["content"].startswith("State the final answer")


def test_curriculum_raises_the_train_level_when_the_window_passes_the_threshold():
    bundle = load_bundle("reasoning_gym", datasets={"chain_sum": {}}, level=0, train_size=30, eval_size=10,
                         curriculum_threshold=0.75, curriculum_window=4)
    eval_before, train_before = questions(bundle, "eval"), questions(bundle, "train")
    assert bundle.metrics() == {"env/level": 0.0}

    def play(split: str, right: bool) -> None:
        episode = bundle.episode(split, 0)
        episode.call_tool("answer", {"answer": answer_of(bundle, split, 0) if right else "x"})

    for right in (True, True, False, True):  # 3/4 = 0.75 reaches the threshold
        play("train", right)
    assert bundle.metrics() == {"env/level": 1.0}
    harder = questions(bundle, "train")
    assert harder != train_before and len(harder) == 30 and not set(harder) & set(eval_before)
    assert questions(bundle, "eval") == eval_before  # eval stays at env.level: rewards compare across steps
    assert bundle.task_info("train", 0).task_id.startswith("rg-chain_sum-train-L1-")
    for _ in range(8):
        play("eval", True)  # eval episodes never move the curriculum
    for right in (False, True, False, True):
        play("train", right)
    assert bundle.metrics() == {"env/level": 1.0}
    assert load_bundle("reasoning_gym", train_size=2, eval_size=2).metrics() == {}


def test_demonstrations_answer_with_the_datasets_answer():
    bundle = load_bundle("reasoning_gym", datasets={"chain_sum": {}}, level=0, train_size=4, eval_size=4)
    chat = bundle.demonstration("train", 3, "label")
    assert chat[2]["tool_calls"][0]["function"]["arguments"] == f'{{"answer": "{answer_of(bundle, "train", 3)}"}}'
    text = load_bundle("reasoning_gym", level=0, train_size=4, eval_size=4, answer_mode="text")
    assert text.demonstration("train", 0, "label")[-1]["content"] == f"Answer: {answer_of(text, 'train', 0)}"


def test_bad_dataset_names_and_configs_fail_naming_the_setting():
    with pytest.raises(ValueError, match=r"env.datasets: unknown reasoning-gym dataset 'chain_summ' "
                                         r"\(did you mean chain_sum"):
        load_bundle("reasoning_gym", datasets={"chain_summ": {}})
    with pytest.raises(ValueError, match=r"env.datasets.chain_sum: reasoning-gym refused the config.*bogus"):
        load_bundle("reasoning_gym", datasets={"chain_sum": {"bogus": 1}})
    with pytest.raises(ValueError, match=r"env.datasets.chain_sum: only \d+ distinct questions"):
        load_bundle("reasoning_gym", datasets={"chain_sum": {}}, level=0, train_size=400, eval_size=10)
    with pytest.raises(ValueError, match="env.answer_mode"):
        load_bundle("reasoning_gym", answer_mode="voice")
