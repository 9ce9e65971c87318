"""MLflow run names a person can tell apart: the recipe, the overrides that differ (short form), the seed.

`gridsim_grpo steps=5 lr=3e-05 seed=0`; in a sweep only the overrides that vary between its jobs, and the
job's number, so no two jobs of one sweep share a name (`gridsim_grpo lr=3e-05 seed=0 #1`).
"""

from __future__ import annotations

from collections.abc import Iterable

# Overrides a name leaves out: named otherwise (recipe, seed) or not about what the run trains.
_SKIP_KEYS = ("recipe", "seed", "dry_run", "description", "task_name")
_SKIP_PREFIXES = ("logger.", "paths.", "hydra.", "hydra/")
_VALUE_CHARS = 24
_NAME_CHARS = 240  # MLflow keeps run names up to 250 characters


def split_override(override: str) -> tuple[str, str | None]:
    """`+trainer.lr=1e-5` -> ("trainer.lr", "1e-5"); a deletion (`~key`) has no value."""
    key, sep, value = override.lstrip("+~").partition("=")
    return key.strip(), (value.strip() if sep else None)


def _named(key: str) -> bool:
    return key not in _SKIP_KEYS and not key.startswith(_SKIP_PREFIXES)


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each key's shortest dotted suffix that no other key here ends with (`trainer.warm_start.steps` ->
    `warm_start.steps` beside `trainer.steps`, else `steps`)."""
    parts = {k: k.replace("/", ".").split(".") for k in keys}
    depth = dict.fromkeys(keys, 1)
    while True:
        short = {k: ".".join(parts[k][-depth[k]:]) for k in keys}
        clash = [k for k in keys if sum(s == short[k] for s in short.values()) > 1 and depth[k] < len(parts[k])]
        if not clash:
            return short
        for k in clash:
            depth[k] += 1


def _short_value(value: str) -> str:
    return value if len(value) <= _VALUE_CHARS else value[: _VALUE_CHARS - 1] + "…"


def run_name(recipe: str, overrides: Iterable[str], seed: object, *, fixed_keys: Iterable[str] = (),
             job: int | None = None) -> str:
    """The run's name. `fixed_keys`: keys a sweep sets to one value for all its jobs (left out);
    `job`: the job's number in its sweep (None outside a sweep)."""
    fixed = set(fixed_keys)
    pairs = [split_override(o) for o in overrides]
    pairs = [(k, v) for k, v in pairs if k and _named(k) and k not in fixed]
    short = short_keys([k for k, _ in pairs])
    parts = [recipe] + [f"{short[k]}={_short_value(v)}" if v is not None else f"~{short[k]}" for k, v in pairs]
    parts.append(f"seed={seed}")
    tail = f" #{job}" if job is not None else ""
    name = " ".join(parts)
    if len(name) + len(tail) > _NAME_CHARS:
        name = name[: _NAME_CHARS - len(tail) - 1] + "…"
    return name + tail
