"""`env=reasoning_gym`: procedural tasks from the reasoning-gym library, graded by its own scorers.

Each dataset in `env.datasets` (name -> its reasoning-gym config, plus optional `train_size`/`eval_size`)
gives `train_size` train and `eval_size` eval tasks. Both splits come from seeds (the dataset's seed is
`env.seed` plus a hash of its name; eval uses the next seed), and an eval question that is also a train
question is skipped, so the splits never overlap. `env.level` (null: the library's default config) sets the
difficulty through reasoning-gym's curriculum; with `env.curriculum_threshold` the train split moves one
level up each time the mean train score of the last `curriculum_window` episodes reaches the threshold
(`env/level` in the trainer's metrics; the eval split stays at `env.level`, so eval rewards compare).

The answer goes through the `answer` tool (`answer_mode=tool`), the final reply (`text`: an
`<answer>...</answer>` tag, an `Answer: ...` line or the whole reply), or either (`both`).
"""

from __future__ import annotations

import difflib
import json
import threading
import zlib
from collections import deque
from typing import Any

from agentrl.answers import extract_answer
from agentrl.envs.task import Bundle, Episode, TaskInfo, ToolResult, Turn

SYSTEM_TOOL = "Solve the problem. Give your final answer with the answer tool."
SYSTEM_TEXT = "Solve the problem. End your reply with the final answer as: Answer: <answer>"
ANSWER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "answer",
        "description": "Submit your final answer; it ends the episode.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}
SIZE_KEYS = ("train_size", "eval_size")


def text_answer(reply: str) -> str:
    """The answer in a final reply: an <answer> tag, an `Answer:` line (or boxed), else the whole reply."""
    from reasoning_gym.utils import extract_answer as tagged

    return (tagged(reply or "") or extract_answer(reply or "") or (reply or "")).strip()


def as_datasets(value: Any) -> dict[str, dict[str, Any]]:
    """`env.datasets` as name -> config: a mapping as given, a list of names (or of one-key mappings), a
    comma-separated string; None: chain_sum."""
    if value is None:
        return {"chain_sum": {}}
    if isinstance(value, str):
        return {name.strip(): {} for name in value.split(",") if name.strip()}
    if hasattr(value, "items"):
        return {str(k): dict(v or {}) for k, v in value.items()}
    out: dict[str, dict[str, Any]] = {}
    for item in value:
        out.update(as_datasets(item))
    return out


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class ReasoningGymEpisode(Episode):
    """One question: one answer (tool or final reply), scored by the dataset's own `score_answer`."""

    def __init__(self, bundle: ReasoningGymBundle, entry: dict[str, Any], info: TaskInfo) -> None:
        self.bundle, self.entry, self.info = bundle, entry, info
        self.score: float | None = None

    def first_turn(self) -> Turn:
        tools = [ANSWER_TOOL] if self.bundle.answer_mode in ("tool", "both") else []
        return Turn(prompt=self.entry["question"], system_prompt=self.bundle.system_prompt, tools=tools)

    def _grade(self, answer: str) -> None:
        self.score = self.bundle.grade(self.entry, answer)
        if self.info.split == self.bundle.train_split:
            self.bundle.observe(self.score)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        answer = arguments.get("answer") if isinstance(arguments, dict) else None
        if name != "answer" or self.bundle.answer_mode == "text":
            return ToolResult(json.dumps({"error": f"there is no tool {name!r}"}), is_error=True)
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or self.score is not None:
            return ToolResult(json.dumps({"error": 'give {"answer": "<your answer>"} once'}), is_error=True,
                              done=self.score is not None)
        self._grade(answer)
        return ToolResult(json.dumps({"accepted": True}), done=True)

    def end_turn(self, response: str) -> Turn | None:
        if self.score is None:
            # Tool mode: a reply without the tool scores 0; text and both: the reply is the answer.
            self._grade(text_answer(response) if self.bundle.answer_mode != "tool" else "")
        return None

    @property
    def done(self) -> bool:
        return self.score is not None

    def scores(self) -> dict[str, float]:
        return {} if self.score is None else {"correct": self.score}


class ReasoningGymBundle(Bundle):
    """Train and eval tasks of one or more reasoning-gym datasets; optional curriculum on the train split."""

    name = "reasoning_gym"
    version = "1"
    teachers = ("label",)  # SFT demonstrations answer with the dataset's own answer
    # The scores an episode reports (reward=rubric checks a Score's name against them when the plan is built).
    score_names = ("correct",)
    eval_breakdown = {"dataset": "reward_{}"}  # eval/reward_<dataset>
    eval_strata = "dataset"

    def __init__(self, datasets: Any = None, *, train_size: int = 256, eval_size: int = 64,
                 seed: int = 0, level: int | None = None, answer_mode: str = "tool",
                 system_prompt: str | None = None, curriculum_threshold: float | None = None,
                 curriculum_window: int = 64, max_level: int = 10, train_split: str = "train",
                 eval_split: str = "eval") -> None:
        import reasoning_gym  # noqa: F401 - a missing install fails at plan time, naming the extra

        datasets = as_datasets(datasets)
        if not datasets:
            raise ValueError("env.datasets is empty: name at least one reasoning-gym dataset")
        known = dataset_names()
        for ds in datasets:
            if ds not in known:
                near = difflib.get_close_matches(ds, known, n=3)
                raise ValueError(f"env.datasets: unknown reasoning-gym dataset {ds!r}"
                                 + (f" (did you mean {', '.join(near)}?)" if near else "")
                                 + f"; there are {len(known)}, e.g. {', '.join(known[:8])}, ...")
        if answer_mode not in ("tool", "text", "both"):
            raise ValueError(f"env.answer_mode must be tool, text or both, not {answer_mode!r}")
        if min(train_size, eval_size, curriculum_window) < 1:
            raise ValueError("env.train_size, env.eval_size and env.curriculum_window must be >= 1")
        self.options = {"datasets": {k: dict(v or {}) for k, v in datasets.items()}, "train_size": train_size,
                        "eval_size": eval_size, "seed": seed, "level": level, "answer_mode": answer_mode,
                        "system_prompt": system_prompt, "curriculum_threshold": curriculum_threshold,
                        "curriculum_window": curriculum_window, "max_level": max_level}
        self.answer_mode = answer_mode
        self.system_prompt = system_prompt or (SYSTEM_TOOL if answer_mode == "tool" else SYSTEM_TEXT)
        self.train_split, self.eval_split = train_split, eval_split
        self.threshold, self.max_level = curriculum_threshold, int(max_level)
        self._window: deque[float] = deque(maxlen=int(curriculum_window))
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {}  # dataset name -> its reasoning-gym dataset (scorer), eval level
        self._eval = self._build(level, eval_split)
        self.level = level
        self._train = self._build(level, train_split)

    # -- data ------------------------------------------------------------------------------------------

    def _config(self, name: str, level: int | None) -> dict[str, Any]:
        """The dataset's config at `level` (the curriculum's), the user's per-dataset keys on top."""
        user = {k: v for k, v in self.options["datasets"][name].items() if k not in SIZE_KEYS}
        if level is None:
            return user
        from reasoning_gym.factory import create_curriculum, has_curriculum

        if not has_curriculum(name):
            return user
        curriculum = create_curriculum(name)
        curriculum.set_global_level(min(int(level), curriculum.get_max_level()))
        config = vars(curriculum.generate_configuration()).copy()
        for key in ("seed", "size"):
            config.pop(key, None)
        return {**config, **user}

    def _entries(self, name: str, level: int | None, split: str, exclude: set[str]) -> list[dict[str, Any]]:
        """`size` entries of `name` for `split` (seeded), none of whose questions is in `exclude`."""
        from reasoning_gym import create_dataset

        size = int(self.options["datasets"][name].get(f"{split}_size", self.options[f"{split}_size"]))
        seed = int(self.options["seed"]) + zlib.crc32(name.encode()) % 100_000 * 2 + (split == self.eval_split)
        seed += 1_000_003 * (level or 0) if split == self.train_split else 0  # a new level: new train draws
        try:
            dataset = create_dataset(name, seed=seed, size=size * 8 + 256, **self._config(name, level))
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValueError(f"env.datasets.{name}: reasoning-gym refused the config: {exc}") from exc
        entries, seen = [], set(exclude)
        for i in range(len(dataset)):
            entry = dataset[i]
            if entry["question"] in seen:
                continue
            seen.add(entry["question"])
            entries.append(entry)
            if len(entries) == size:
                break
        else:
            raise ValueError(f"env.datasets.{name}: only {len(entries)} distinct questions for {split} "
                             f"(env.{split}_size={size}) at level {level}; lower the size or raise the difficulty")
        if split == self.eval_split:
            self._data[name] = dataset
        return entries

    def _build(self, level: int | None, split: str) -> list[tuple[str, dict[str, Any]]]:
        tasks = []
        for name in self.options["datasets"]:
            exclude = {e["question"] for n, e in self._eval if n == name} if split == self.train_split else set()
            tasks += [(name, e) for e in self._entries(name, level, split, exclude)]
        return tasks

    def grade(self, entry: dict[str, Any], answer: str) -> float:
        """The dataset's own score of `answer` (0.0 when its scorer fails on a malformed answer)."""
        from reasoning_gym import get_score_answer_fn

        try:
            return float(get_score_answer_fn(entry["metadata"]["source_dataset"])(answer, entry))
        except Exception:  # noqa: BLE001 - a scorer choking on model text is a wrong answer, not an env error
            return 0.0

    # -- curriculum ------------------------------------------------------------------------------------

    def observe(self, score: float) -> None:
        """A train episode's score; a full window at the threshold moves the train split one level up."""
        if self.threshold is None:
            return
        with self._lock:
            self._window.append(score)
            full = len(self._window) == self._window.maxlen
            current = self.level or 0
            if not full or sum(self._window) / len(self._window) < self.threshold or current >= self.max_level:
                return
            self._window.clear()
            self._train = self._build(current + 1, self.train_split)
            self.level = current + 1

    def metrics(self) -> dict[str, float]:
        """What the trainer logs beside its own metrics: the train split's level under a curriculum."""
        return {"env/level": float(self.level or 0)} if self.threshold is not None else {}

    # -- the Bundle interface --------------------------------------------------------------------------

    def _tasks(self, split: str) -> list[tuple[str, dict[str, Any]]]:
        if split == self.train_split:
            return self._train
        if split == self.eval_split:
            return self._eval
        raise KeyError(f"bundle reasoning_gym has no split {split!r}; it has {self.train_split}, {self.eval_split}")

    def splits(self) -> dict[str, int]:
        return {self.train_split: len(self._train), self.eval_split: len(self._eval)}

    def _task(self, split: str, index: int) -> tuple[str, dict[str, Any]]:
        tasks = self._tasks(split)
        if not isinstance(index, int) or not 0 <= index < len(tasks):
            raise IndexError(f"split {split!r} has no task {index!r} (0..{len(tasks) - 1})")
        return tasks[index]

    def task_info(self, split: str, index: int) -> TaskInfo:
        name, entry = self._task(split, index)
        level = self.level if split == self.train_split else self.options["level"]
        return TaskInfo(task_id=f"rg-{name}-{split}-L{level or 0}-{index:05d}", split=split, index=index,
                        extra={"dataset": name})

    def episode(self, split: str, index: int) -> ReasoningGymEpisode:
        return ReasoningGymEpisode(self, self._task(split, index)[1], self.task_info(split, index))

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        """The question answered with the dataset's own answer: by the tool, or as `Answer: ...` text."""
        if teacher not in self.teachers:
            raise ValueError(f"reasoning_gym teacher must be one of {self.teachers}, not {teacher!r}")
        _, entry = self._task(split, index)
        head = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": entry["question"]}]
        if self.answer_mode == "text":
            return [*head, {"role": "assistant", "content": f"Answer: {entry['answer']}"}]
        call = {"id": f"call_{split}_{index}", "type": "function",
                "function": {"name": "answer", "arguments": json.dumps({"answer": str(entry["answer"])})}}
        return [*head, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "name": "answer",
                 "content": json.dumps({"accepted": True})}]

    def spec(self) -> dict[str, Any]:
        return {"bundle": "reasoning_gym", "train_split": self.train_split, "eval_split": self.eval_split,
                **self.options}

    def data_options(self) -> dict[str, Any]:
        return dict(self.options)
