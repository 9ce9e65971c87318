"""`env=mix`: several bundles served as one, each train row drawn from one of them by weight.

The mix's train split holds `train_size` rows (default: its groups' train tasks together); each group fills its
weight's share of them (largest remainder), with its own train tasks in a seeded order (cycled when the share is
larger), and the rows are interleaved in a seeded order. A trainer's uniform draw over the split (`RowStream`)
then draws each group in proportion, exactly so over an epoch. The eval split takes every group's eval tasks in
turn (the first of each, then the second, ...); an eval of N tasks (`trainer.eval_limit`) is stratified by group
(`eval_strata`), so it keeps each group's share, its tasks spread over the group's eval split.

Every task carries its group as the fact `bundle`, its task id is `<group>/<the bundle's task id>`, and the episode
is the group's bundle's own: the reward is that bundle's grade. `eval_breakdown` and `train_breakdown` turn the fact
into `eval/reward/<group>` and `train/reward/<group>`.

The warm start (`trainer.warm_start.teacher`): `each` demonstrates every row by its group's own teacher (the
group's `demonstrations`, else the first its bundle offers); a teacher some groups offer is theirs, the other groups
use their own. A mix with a group whose bundle has no teachers offers none.

Standard library only, as the loader (`envs/bundles/__init__.py`): a sandbox rebuilds the mix from `spec()`, whose
groups are resolved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrl.envs.bundles import load_bundle
from agentrl.envs.seeded_rng import Rng
from agentrl.envs.task import Bundle, Episode, TaskInfo, WrappedEpisode

EACH = "each"  # the teacher that demonstrates each row by its own group's teacher
BUNDLE_FACT = "bundle"  # the task fact naming a row's group
PER_GROUP = {BUNDLE_FACT: "reward/{}"}  # -> eval/reward/<group>, train/reward/<group>


@dataclass
class Member:
    """One group of the mix: its name, weight, bundle, and the teacher its rows are demonstrated by."""

    name: str
    weight: float
    bundle: Bundle
    teacher: str | None
    train_split: str
    eval_split: str


def shares(weights: list[float], total: int) -> list[int]:
    """`total` split in proportion to `weights` (largest remainder: the counts sum to `total` exactly)."""
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


class MixEpisode(WrappedEpisode):
    """A group's own episode, seen under the mix's task facts."""

    def __init__(self, inner: Episode, info: TaskInfo) -> None:
        super().__init__(inner)
        self.info = info


class MixBundle(Bundle):
    """Several bundles as one: the train split drawn by weight, the eval split every group's in turn."""

    name = "mix"
    version = "1"
    train_breakdown = PER_GROUP
    eval_strata = BUNDLE_FACT

    def __init__(self, groups: list[dict[str, Any]], *, train_size: int | None = None, seed: int = 0,
                 train_split: str = "train", eval_split: str = "eval") -> None:
        if not groups:
            raise ValueError("env.bundles is empty: env=mix needs at least one bundle and its weight")
        self.groups, self.seed, self.train_size = [dict(g) for g in groups], int(seed), train_size
        self.train_split, self.eval_split = train_split, eval_split
        self.members = [self._member(g) for g in self.groups]
        self.inline_episodes = all(m.bundle.inline_episodes for m in self.members)
        self.eval_breakdown = {**{k: v for m in self.members for k, v in m.bundle.eval_breakdown.items()},
                               **PER_GROUP}
        self.teachers = self._teachers()
        self._train = self._interleave_train()
        self._eval = self._interleave_eval()

    # -- building --------------------------------------------------------------------------------------

    @staticmethod
    def _member(group: dict[str, Any]) -> Member:
        where = f"env.bundles.{group['name']}"
        try:
            bundle = load_bundle(**group["spec"])
        except (TypeError, ValueError, KeyError, ImportError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
        spec = group["spec"]
        member = Member(group["name"], float(group["weight"]), bundle, group.get("demonstrations"),
                        spec["train_split"], spec["eval_split"])
        offered = tuple(bundle.teachers)
        if member.teacher is not None and member.teacher not in offered:
            raise ValueError(f"{where}.demonstrations={member.teacher}: bundle {bundle.name} offers "
                             f"{', '.join(offered) or 'no teachers'}")
        return member

    def _teachers(self) -> tuple[str, ...]:
        if not all(m.bundle.teachers for m in self.members):
            return ()
        union = [t for m in self.members for t in m.bundle.teachers]
        return (EACH, *dict.fromkeys(union))

    def _interleave_train(self) -> list[tuple[int, int]]:
        counts = [m.bundle.splits()[m.train_split] for m in self.members]
        total = sum(counts) if self.train_size is None else int(self.train_size)
        if total < len(self.members):
            raise ValueError(f"env.train_size={total}: a mix of {len(self.members)} groups needs at least one row "
                             "for each")
        wanted = shares([m.weight for m in self.members], total)
        for m, n in zip(self.members, wanted, strict=True):
            if n == 0:
                raise ValueError(f"env.bundles.{m.name}: weight {m.weight:g} gives it no row of the "
                                 f"{total}-row train split; raise its weight or env.train_size")
        rows: list[tuple[int, int]] = []
        for g, (m, n, count) in enumerate(zip(self.members, wanted, counts, strict=True)):
            order: list[int] = []
            cycle = 0
            while len(order) < n:  # a share beyond the group's tasks takes them again, in a new order
                fresh = list(range(count))
                Rng.from_key(f"mix/{self.seed}/{m.name}/{cycle}").shuffle(fresh)
                order += fresh
                cycle += 1
            rows += [(g, i) for i in order[:n]]
        Rng.from_key(f"mix/{self.seed}/interleave").shuffle(rows)
        return rows

    def _interleave_eval(self) -> list[tuple[int, int]]:
        counts = [m.bundle.splits()[m.eval_split] for m in self.members]
        return [(g, i) for i in range(max(counts)) for g, count in enumerate(counts) if i < count]

    # -- the Bundle interface --------------------------------------------------------------------------

    def splits(self) -> dict[str, int]:
        return {self.train_split: len(self._train), self.eval_split: len(self._eval)}

    def locate(self, split: str, index: int) -> tuple[Member, str, int]:
        """The group, its split and its index behind task `index` of the mix's `split`."""
        if split == self.train_split:
            rows, sub_split = self._train, "train_split"
        elif split == self.eval_split:
            rows, sub_split = self._eval, "eval_split"
        else:
            raise KeyError(f"bundle mix has no split {split!r}; it has {self.train_split}, {self.eval_split}")
        if not isinstance(index, int) or not 0 <= index < len(rows):
            raise IndexError(f"bundle mix split {split!r} has no task {index!r} (0..{len(rows) - 1})")
        g, sub_index = rows[index]
        member = self.members[g]
        return member, getattr(member, sub_split), sub_index

    def task_info(self, split: str, index: int) -> TaskInfo:
        member, sub_split, sub_index = self.locate(split, index)
        info = member.bundle.task_info(sub_split, sub_index)
        return TaskInfo(task_id=f"{member.name}/{info.task_id}", split=split, index=index, toolset=info.toolset,
                        extra={**info.extra, BUNDLE_FACT: member.name})

    def episode(self, split: str, index: int) -> MixEpisode:
        member, sub_split, sub_index = self.locate(split, index)
        return MixEpisode(member.bundle.episode(sub_split, sub_index), self.task_info(split, index))

    def spec(self) -> dict[str, Any]:
        # The group's splits beside its bundle's own spec: a bundle's spec() need not name them.
        groups = [{"name": m.name, "weight": m.weight, "demonstrations": m.teacher,
                   "spec": {**m.bundle.spec(), "train_split": m.train_split, "eval_split": m.eval_split}}
                  for m in self.members]
        return {"bundle": "mix", "groups": groups, "train_size": self.train_size, "seed": self.seed,
                "train_split": self.train_split, "eval_split": self.eval_split}

    def data_options(self) -> dict[str, Any]:
        """Every group's name, weight, teacher, bundle and data options, the train size and the seed."""
        groups = [{"name": m.name, "weight": m.weight, "demonstrations": m.teacher, "bundle": m.bundle.name,
                   "splits": [m.train_split, m.eval_split], "data": m.bundle.data_options()} for m in self.members]
        return {"groups": json.dumps(groups, sort_keys=True, default=str), "train_size": self.train_size,
                "seed": self.seed}

    def metrics(self) -> dict[str, float]:
        """Each group's bundle's own metrics, `/<group>` appended (reasoning_gym's curriculum: env/level/<group>)."""
        return {f"{k}/{m.name}": v for m in self.members for k, v in m.bundle.metrics().items()}

    def teacher_of(self, member: Member, teacher: str) -> str:
        """The teacher that demonstrates `member`'s rows when the warm start asks for `teacher`."""
        if teacher != EACH and teacher in member.bundle.teachers:
            return teacher
        if teacher != EACH and teacher not in self.teachers:
            raise ValueError(f"bundle mix offers the teachers {', '.join(self.teachers)}, not {teacher!r}")
        return member.teacher or member.bundle.teachers[0]

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        member, sub_split, sub_index = self.locate(split, index)
        return member.bundle.demonstration(sub_split, sub_index, self.teacher_of(member, teacher))

    def demonstration_variant(self, split: str, index: int, teacher: str, rng: Any) -> list[dict[str, Any]]:
        member, sub_split, sub_index = self.locate(split, index)
        return member.bundle.demonstration_variant(sub_split, sub_index, self.teacher_of(member, teacher), rng)

    def generated_demonstration(self, index: int, teacher: str, seed: int) -> list[dict[str, Any]]:
        raise NotImplementedError("env=mix generates no extra tasks (set trainer.warm_start.generated=0)")


def make_bundle(bundles: Any = None, groups: list[dict[str, Any]] | None = None, **options: Any) -> MixBundle:
    """`load_bundle("mix", bundles=...)`'s factory: `bundles` as the config gives it (checked and typed by
    `groups.mix_groups`), or `groups` already resolved (a `spec()`, e.g. inside a sandbox)."""
    if groups is None:
        # OmegaConf and the schemas: needed only where plans are built, never in a sandbox.
        from agentrl.envs.bundles.mix.groups import mix_groups

        groups = mix_groups(bundles)
    elif bundles is not None:
        raise TypeError("give env=mix its bundles or its resolved groups, not both")
    return MixBundle(groups, **options)
