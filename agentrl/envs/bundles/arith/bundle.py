"""The arith bundle: verifiable integer-answer problems, or a user's own DAPO-style JSON Lines file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.answers import answers_match, extract_answer, verify_answer
from agentrl.config.bundle_options import ArithOptions, option_defaults
from agentrl.envs.bundles import FolderBundle, read_jsonl
from agentrl.envs.task import Episode, TaskInfo, ToolResult, Turn

TEACHERS = ("optimal", "label")  # both answer with the label
SYSTEM_PROMPT = "You are a careful mathematician. Reason step by step and state one final answer."
SUBMIT_ANSWER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit_answer",
        "description": "Submit your final answer to the problem. Only the first submission counts; it ends the "
                       "episode.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The final answer, e.g. \"42\"."}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}


def _lookup(row: dict[str, Any], key: str) -> Any:
    """`row[key]`, where a dotted key walks nested objects (`reward_model.ground_truth`)."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def _messages(prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if (isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt)
            and any(m.get("role", "user") == "user" for m in prompt)):
        return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in prompt]
    raise ValueError("the prompt must be a string or a list of chat messages with a user message")


def load_user_rows(path: str | Path, prompt_key: str = "prompt", label_key: str = "label") -> list[dict[str, Any]]:
    """A DAPO-style JSON Lines file (`.jsonl` or `.jsonl.gz`) as bundle rows: prompt messages and string label."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"arith data_file {path} does not exist")
    try:
        raw = read_jsonl(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"arith data_file {path} is not JSON Lines: {e}") from e
    rows = []
    for i, row in enumerate(raw):
        try:
            prompt, label = _lookup(row, prompt_key), _lookup(row, label_key)
            messages = _messages(prompt)
        except KeyError as e:
            raise ValueError(f"arith data_file {path} row {i}: missing key {e.args[0]!r} "
                             f"(prompt_key={prompt_key!r}, label_key={label_key!r})") from None
        except ValueError as e:
            raise ValueError(f"arith data_file {path} row {i}: {e}") from None
        rows.append({"task_id": f"arith-{path.name.split('.')[0]}-{i:05d}", "prompt": messages,
                     "label": str(label), "level": row.get("level"), "topic": row.get("topic")})
    if not rows:
        raise ValueError(f"arith data_file {path} has no rows")
    return rows


class ArithEpisode(Episode):
    """Answer one problem: graded from the reply text at end_turn, or from a `submit_answer` call."""

    def __init__(self, row: dict[str, Any], info: TaskInfo) -> None:
        self._row = row  # holds the label: never shown to the agent
        self.info = info
        self._correct: float | None = None
        self._done = False
        self.answer: str | None = None

    def first_turn(self) -> Turn:
        messages = self._row["prompt"]
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system") or SYSTEM_PROMPT
        user = [m["content"] for m in messages if m["role"] == "user"][-1]
        return Turn(prompt=user, system_prompt=system, tools=[SUBMIT_ANSWER_TOOL])

    @property
    def done(self) -> bool:
        return self._done

    def scores(self) -> dict[str, float]:
        return {} if self._correct is None else {"correct": self._correct}

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != "submit_answer":
            return ToolResult(json.dumps({"error": f"unknown tool {name!r}; the only tool is submit_answer"}),
                              is_error=True, done=self._done)
        if self._done:
            return ToolResult(json.dumps({"error": "the episode is over; an answer was already recorded"}),
                              is_error=True, done=True)
        answer = arguments.get("answer") if isinstance(arguments, dict) else None
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or str(answer).strip() == "":
            return ToolResult(json.dumps({"accepted": False, "error": "give the answer as a non-empty string, "
                                          "e.g. {\"answer\": \"42\"}"}))
        answer = str(answer).strip()
        # A boxed or "Answer:" wrapper inside the argument is unwrapped like reply text.
        self.answer = extract_answer(answer) or answer
        self._correct = 1.0 if answers_match(self.answer, self._row["label"]) else 0.0
        self._done = True
        return ToolResult(json.dumps({"accepted": True, "answer": self.answer, "done": True}), done=True)

    def end_turn(self, response: str) -> Turn | None:
        if not self._done:
            self.answer = extract_answer(response or "")
            self._correct = verify_answer(response or "", self._row["label"])
            self._done = True
        return None


class ArithBundle(FolderBundle):
    """Generated arithmetic problems; `data_file` replaces the train split with a user's own rows."""

    inline_episodes = True  # pure computation of microseconds: no worker thread needed
    OPTIONS = option_defaults(ArithOptions)
    teachers = TEACHERS
    # The scores an episode reports (reward=rubric checks a Score's name against them when the plan is built).
    score_names = ("correct",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        data_file = self.options["data_file"]
        if data_file:
            path = Path(str(data_file)).expanduser().resolve()
            self.options["data_file"] = str(path)
            self._rows["train"] = load_user_rows(path, self.options["prompt_key"], self.options["label_key"])
            self._counts["train"] = len(self._rows["train"])

    def data_options(self) -> dict[str, Any]:
        # The keys only matter for a user's file; without one the shipped rows are the data.
        if not self.options["data_file"]:
            return {}
        return {k: self.options[k] for k in ("data_file", "prompt_key", "label_key")}

    def task_info(self, split: str, index: int) -> TaskInfo:
        r = self.row(split, index)
        return TaskInfo(task_id=r["task_id"], split=split, index=index,
                        extra={"level": r.get("level"), "topic": r.get("topic")})

    def episode(self, split: str, index: int) -> ArithEpisode:
        return ArithEpisode(self.row(split, index), self.task_info(split, index))

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        """The problem answered correctly (teacher `optimal` or `label`): system, user, assistant messages."""
        if teacher not in TEACHERS:
            raise ValueError(f"arith teacher must be one of {TEACHERS}, not {teacher!r}")
        turn = self.episode(split, index).first_turn()
        return [{"role": "system", "content": turn.system_prompt}, {"role": "user", "content": turn.prompt},
                {"role": "assistant", "content": f"Answer: {self.row(split, index)['label']}"}]
