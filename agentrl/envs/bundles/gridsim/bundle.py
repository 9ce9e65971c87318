"""The GridSim bundle: stored task packs served as episodes, plus SFT demonstrations."""

from __future__ import annotations

import json
from typing import Any

from agentrl.config.bundle_options import GridSimOptions, option_defaults
from agentrl.envs.bundles import FolderBundle
from agentrl.envs.task import TaskInfo

from .battery import UNITS_PER_USD, Battery, greedy, optimum
from .episode import GridSimEpisode, parse_day
from .prompts import PROMPT_STYLES, TOOL_NAME, system_prompt, tool_schema, user_prompt
from .tasks import DURATIONS, EFFICIENCIES, GENERATED_SPLIT_STREAM, POWERS, cents_of, generated_task

TEACHERS = ("optimal", "greedy")
GENERATED = "generated"  # the split of env.generated_days fresh train-like days
# Trainers shuffle a split's indices (`RowStream`): 10 million is ~80 MB of them, far more days than a run plays.
MAX_GENERATED_DAYS = 10_000_000
# Public facts a TaskInfo may carry; everything else in a record (optimum, greedy) stays hidden.
_PUBLIC = ("date", "weekday", "season", "settlement_point")


class GridSimBundle(FolderBundle):
    """GridSim v1: one battery, one day of day-ahead prices, graded against the exact optimum."""

    inline_episodes = True  # pure computation of microseconds: no worker thread needed
    OPTIONS = option_defaults(GridSimOptions)
    DATA_OPTIONS = ("prompt_style", "generated_days")
    teachers = TEACHERS
    # The scores an episode reports (reward=rubric checks a Score's name against them when the plan is built).
    score_names = ("grade",)
    eval_breakdown = {"duration_h": "reward_{}h"}  # a battery's hours of storage: 1h, 2h, 4h
    eval_strata = "duration_h"  # the eval split is stored in blocks of one duration

    def __init__(self, folder: Any, manifest: dict[str, Any], **kwargs: Any) -> None:
        days = kwargs.get("generated_days", self.OPTIONS["generated_days"])
        if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days <= MAX_GENERATED_DAYS:
            raise ValueError(f"gridsim generated_days (env.generated_days) must be a whole number from 0 to "
                             f"{MAX_GENERATED_DAYS:,}, got {days!r}")
        if days:  # a split made on demand: no file, `generated_task` draws its day `index` when asked
            manifest = {**manifest, "splits": {**manifest["splits"], GENERATED: {"count": days}}}
        super().__init__(folder, manifest, **kwargs)
        style = self.options["prompt_style"]
        if style not in PROMPT_STYLES:
            raise ValueError(f"gridsim prompt_style must be one of {PROMPT_STYLES}, not {style!r}")
        self.prompt_style = style
        self._infos: dict[tuple[str, int], TaskInfo] = {}
        self._days: dict[tuple[str, int], tuple] = {}

    def data_options(self) -> dict[str, Any]:
        return _without_no_split(super().data_options())

    def spec(self) -> dict[str, Any]:
        return _without_no_split(super().spec())

    def rows(self, split: str) -> list[dict[str, Any]]:
        if split == GENERATED and GENERATED in self.splits() and split not in self._rows:
            self._rows[split] = [generated_task(i, GENERATED_SPLIT_STREAM) for i in range(self.splits()[split])]
        return super().rows(split)

    def row(self, split: str, index: int) -> dict[str, Any]:
        if split != GENERATED or GENERATED not in self.splits() or split in self._rows:
            return super().row(split, index)
        count = self.splits()[split]
        if not isinstance(index, int) or not 0 <= index < count:
            raise IndexError(f"bundle {self.name!r} split {split!r} has no task {index!r} (0..{count - 1})")
        return generated_task(index, GENERATED_SPLIT_STREAM)  # ~0.1 ms: drawn when asked, never all at once

    def task_info(self, split: str, index: int) -> TaskInfo:
        if split == GENERATED:  # not kept: a long run plays many thousands of them once each
            return _info_of(self.row(split, index), split, index)
        key = (split, index)
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = _info_of(self.row(split, index), split, index)
        return info

    def episode(self, split: str, index: int) -> GridSimEpisode:
        record, info = self.row(split, index), self.task_info(split, index)
        cached = self._days.get((split, index))
        if cached is None:
            cached = (parse_day(record), user_prompt(record, self.prompt_style))
            if split != GENERATED:
                self._days[(split, index)] = cached
        return GridSimEpisode(record, info, self.prompt_style, *cached)

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        """The task played by `teacher` (`optimal` or `greedy`) as OpenAI-style chat messages:
        system, user, assistant calling submit_schedule once, and the tool's answer."""
        return self._played(self.row(split, index), split, index, teacher)

    def demonstration_variant(self, split: str, index: int, teacher: str, rng: Any) -> list[dict[str, Any]]:
        """The same day's prices with another battery (power, duration and efficiency drawn uniformly from the
        generator's choices), played by `teacher`. A small model can memorize 2,000 days' answers; the same
        prices with other durations and efficiencies make it learn how the battery changes the schedule."""
        record = dict(self.row(split, index))
        cents = cents_of(record)
        for _ in range(8):  # the generator's own rule: a day is kept only if it is worth >= $1/MW
            battery = Battery(rng.choice(POWERS), rng.choice(DURATIONS), rng.choice(EFFICIENCIES))
            best, schedule = optimum(cents, battery)
            if best >= UNITS_PER_USD * battery.power_mw:
                break
        else:
            return self.demonstration(split, index, teacher)
        record.update(battery=battery.to_json(), optimal_profit=best / UNITS_PER_USD, optimal_schedule=schedule,
                      greedy_schedule=greedy(cents, battery))
        return self._played(record, split, index, teacher)

    def generated_demonstration(self, index: int, teacher: str, seed: int) -> list[dict[str, Any]]:
        """Day `index` of a generated stream (`tasks.generated_task`: train dates, fresh prices and battery, never
        an eval date) played by `teacher`. The 2,000 stored train days are few for imitating the optimum; the
        generator makes as many more as SFT asks for, at ~0.1 ms each."""
        record = generated_task(index, seed)
        return self._played(record, "generated", index, teacher, _info_of(record, "generated", index))

    def _played(self, record: dict[str, Any], split: str, index: int, teacher: str,
                info: TaskInfo | None = None) -> list[dict[str, Any]]:
        if teacher not in TEACHERS:
            raise ValueError(f"gridsim teacher must be one of {TEACHERS}, not {teacher!r}")
        schedule = record["optimal_schedule" if teacher == "optimal" else "greedy_schedule"]
        arguments = json.dumps({"schedule": schedule})
        prompt = user_prompt(record, self.prompt_style)
        info = self.task_info(split, index) if info is None else info
        episode = GridSimEpisode(record, info, self.prompt_style, parse_day(record), prompt)
        result = episode.call_tool(TOOL_NAME, {"schedule": schedule})
        call_id = f"call_{split}_{index}"
        return [
            {"role": "system", "content": system_prompt(self.prompt_style)},
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "name": TOOL_NAME, "content": result.text},
        ]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [tool_schema(self.prompt_style)]


def _without_no_split(options: dict[str, Any]) -> dict[str, Any]:
    """`options` without `generated_days` when it is 0: a bundle without the split keeps the data key (SFT caches)
    and the spec (env servers of an older agentrl) it always had."""
    return {k: v for k, v in options.items() if k != "generated_days" or v}


def _info_of(record: dict[str, Any], split: str, index: int) -> TaskInfo:
    extra = {k: record[k] for k in _PUBLIC}
    extra.update(record["battery"])
    return TaskInfo(task_id=record["task_id"], split=split, index=index, extra=extra)
