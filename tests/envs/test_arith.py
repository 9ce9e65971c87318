"""The arith bundle: the answer verifier, episodes, generated problems and a user's own JSON Lines file."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.arith import extract_answer, verify_answer
from agentrl.envs.bundles.arith.problems import LEVELS


@pytest.mark.parametrize("text,label", [
    (r"so the total is \boxed{1,000}.", "1000"),
    ("Answer: 1000.0", "1000"),
    ("Answer: $1000$", "1000"),
    (r"Answer: \$1{,}000", "1000"),
    ("<final_answer> 1 000 </final_answer>", "1000"),
    (r"Answer: \boxed{-7}", "-7"),
    (r"\boxed{\frac{12}{4}}", "3"),
    ("Answer: x = 12.", "12"),
    ("**Answer:** 42", "42"),
    (r"\boxed{{5}}", "5"),
    (r"\boxed{\text{42}}", "42"),
    (r"\boxed{12 apples}", "12"),
    ("first I guessed \\boxed{3}, but on checking, Answer: 4", "4"),
    ("<FINAL_ANSWER>-0</FINAL_ANSWER>", "0"),
    ("Answer: 7", 7),
])
def test_verifier_accepts_equivalent_forms(text, label):
    assert verify_answer(text, label) == 1.0


@pytest.mark.parametrize("text,label", [
    ("The answer is 5", "5"),  # no marked final answer
    ("Answer: 1000.5", "1000"),
    ("Answer: 10,00", "1000"),  # not a thousands separator
    (r"\boxed{1}{2}", "12"),
    ("Answer: 4\n\nWait, no. \\boxed{5}", "4"),  # the last marked answer wins
    ("", "0"),
    ("Answer:", "0"),
])
def test_verifier_rejects_wrong_or_unmarked_answers(text, label):
    assert verify_answer(text, label) == 0.0


def test_extract_answer_returns_the_last_marked_answer():
    assert extract_answer(r"\boxed{\frac{1}{2}} ... \boxed{x^{2}}") == "x^{2}"
    assert extract_answer("<final_answer>17</final_answer> trailing") == "17"
    assert extract_answer("nothing to see") is None
    assert verify_answer(r"\boxed{\frac{1}{2}}", r"\frac{1}{2}") == 1.0
    assert verify_answer("Answer: 0.5", "1/2") == 1.0


@pytest.fixture(scope="module")
def arith():
    return load_bundle("arith")


def test_generated_problems_are_graded_and_disjoint(arith):
    train, ev = arith.rows("train"), arith.rows("eval")
    assert {r["level"] for r in ev} == set(range(1, LEVELS + 1))
    assert {r["topic"] for r in train} >= {"arithmetic", "modular", "word"}
    texts = [r["prompt"][0]["content"] for r in train + ev]
    assert len(set(texts)) == len(texts)
    for r in train + ev:  # DAPO-Math row shape
        assert r["prompt"][0]["role"] == "user" and re.fullmatch(r"-?\d+", r["label"])


def test_generated_labels_are_right_for_the_arithmetic_level(arith):
    for r in arith.rows("eval"):
        m = re.search(r"What is (\d+) \+ (\d+) × (\d+)\?", r["prompt"][0]["content"])
        if m:
            a, b, c = map(int, m.groups())
            assert int(r["label"]) == a + b * c


def test_episode_grades_the_reply_text(arith):
    label = arith.row("eval", 4)["label"]
    ep = arith.episode("eval", 4)
    turn = ep.first_turn()
    assert label not in turn.system_prompt and [t["function"]["name"] for t in turn.tools] == ["submit_answer"]
    assert ep.scores() == {} and not ep.done
    assert ep.end_turn(f"Working...\nAnswer: {label}") is None
    assert ep.done and ep.scores() == {"correct": 1.0}
    wrong = arith.episode("eval", 4)
    wrong.end_turn(f"Answer: {int(label) + 1}")
    assert wrong.scores() == {"correct": 0.0}


def test_submit_answer_tool_grades_once_and_answers_bad_calls(arith):
    label = arith.row("eval", 7)["label"]
    ep = arith.episode("eval", 7)
    bad = ep.call_tool("submit_answer", {"answer": ""})
    assert not bad.is_error and not bad.done and "non-empty" in json.loads(bad.text)["error"]
    assert ep.call_tool("submit_answer", {"value": 3}).done is False
    unknown = ep.call_tool("calculator", {"expr": "1+1"})
    assert unknown.is_error and not unknown.done
    res = ep.call_tool("submit_answer", {"answer": f"\\boxed{{{label}}}"})
    assert res.done and "correct" not in json.loads(res.text) and ep.scores() == {"correct": 1.0}
    again = ep.call_tool("submit_answer", {"answer": "0"})
    assert again.is_error and ep.scores() == {"correct": 1.0}
    ep.end_turn("Answer: definitely wrong")  # the tool's submission stands
    assert ep.scores() == {"correct": 1.0}


def test_demonstration_answers_correctly(arith):
    msgs = arith.demonstration("train", 3, "optimal")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert verify_answer(msgs[-1]["content"], arith.row("train", 3)["label"]) == 1.0


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def test_user_jsonl_replaces_the_train_split(tmp_path: Path):
    rows = [{"prompt": [{"role": "user", "content": "What is 6 × 7?"}], "label": "42"},
            {"prompt": "How many sides has a hexagon?", "label": 6}]
    path = _write_jsonl(tmp_path / "mine.jsonl", rows)
    bundle = load_bundle("arith", data_file=str(path))
    assert bundle.splits()["train"] == 2 and bundle.splits()["eval"] == load_bundle("arith").splits()["eval"]
    assert bundle.task_info("train", 1).task_id == "arith-mine-00001"
    ep = bundle.episode("train", 1)
    assert ep.first_turn().prompt == "How many sides has a hexagon?"
    ep.end_turn(r"A hexagon has \boxed{6} sides.")
    assert ep.scores() == {"correct": 1.0}
    spec = bundle.spec()
    assert spec["data_file"] == str(path.resolve())
    assert load_bundle(**spec).splits() == bundle.splits()


def test_user_jsonl_with_custom_and_dotted_keys(tmp_path: Path):
    rows = [{"problem": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
             "reward_model": {"ground_truth": "4"}}]
    path = _write_jsonl(tmp_path / "dapo.jsonl.gz", rows)
    bundle = load_bundle("arith", data_file=str(path), prompt_key="problem", label_key="reward_model.ground_truth")
    turn = bundle.episode("train", 0).first_turn()
    assert (turn.system_prompt, turn.prompt) == ("Be brief.", "2+2?")
    ep = bundle.episode("train", 0)
    ep.end_turn("<final_answer>4</final_answer>")
    assert ep.scores() == {"correct": 1.0}


def test_user_jsonl_errors_name_the_problem(tmp_path: Path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "1+1?", "label": "2"}, {"prompt": "2+2?"}])
    with pytest.raises(ValueError, match=r"row 1: missing key 'label'"):
        load_bundle("arith", data_file=str(path))
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_bundle("arith", data_file=str(tmp_path / "nowhere.jsonl"))
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="not JSON Lines"):
        load_bundle("arith", data_file=str(tmp_path / "junk.jsonl"))
    with pytest.raises(TypeError, match="'answer_key'"):
        load_bundle("arith", answer_key="x")
