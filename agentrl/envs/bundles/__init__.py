"""The bundles, one package each beside this loader (`gridsim/`, `arith/`, `calc/`, `mix/`, `openenv_remote/`,
`reasoning_gym/`, `textarena/`), and `load_bundle`, the `env` config group's target.

A shipped bundle's folder is `<name>/data/`, beside its code. A bundle folder holds `bundle.json` and its data files
(JSON Lines, optionally gzip-compressed):

    {"name": "gridsim", "version": "1", "kind": "agentrl.envs.bundles.gridsim.bundle:GridSimBundle",
     "splits": {"train": {"file": "train.jsonl.gz", "count": 2000}, ...},
     "toolsets": {"default": ["submit_schedule"]},
     "files": {"train.jsonl.gz": "<sha256 hex>", ...}, ...}

`kind` names the class that serves the folder (`module:Class`, or `file.py:Class` for a module file inside the
folder); it must subclass `FolderBundle` or at
least offer `OPTIONS` (option name -> default) and `from_folder(folder, manifest, source=..., train_split=...,
eval_split=..., **options)`. Loading checks every data file's sha256 against the manifest first.

What trainers need to know of a bundle it declares on the `Bundle` interface (`task.py`), so a new bundle
plugs in without touching a trainer: `teachers` (its demonstrations' teachers, for SFT), `eval_breakdown`
(task facts the eval reward is also averaged by) and `DATA_OPTIONS` (the options that change its data, part
of the SFT cache key).

Standard library only: this module runs inside minimal containers.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.envs.task import Bundle, TaskInfo

MANIFEST = "bundle.json"
_PACKAGE_DIR = Path(__file__).resolve().parent  # a shipped bundle's folder is <name>/data/ in here
# Bundles made from a remote server or a library rather than a folder: name -> "module:factory", the factory
# taking the options (and train_split, eval_split) as keywords. `load_bundle(name, ...)` builds them, so their
# `spec()` rebuilds them anywhere, as a folder's does.
GENERATED: dict[str, str] = {
    "mix": "agentrl.envs.bundles.mix:make_bundle",
    "openenv": "agentrl.envs.bundles.openenv_remote:make_bundle",
    "reasoning_gym": "agentrl.envs.bundles.reasoning_gym:make_bundle",
    "textarena": "agentrl.envs.bundles.textarena:make_bundle",
}


class BundleError(ValueError):
    """A bundle folder is missing, malformed, or its data does not match its manifest."""


def shipped_folder(name: str) -> Path:
    """The data folder of shipped bundle `name` (`<name>/data/`, beside its code), whether or not it exists."""
    return _PACKAGE_DIR / name / "data"


def shipped_bundles() -> list[str]:
    """Names of the bundles shipped with agentrl (with a data folder)."""
    return sorted(p.parent.parent.name for p in _PACKAGE_DIR.glob(f"*/data/{MANIFEST}"))


def bundle_folder(bundle: str | Path) -> Path:
    """The folder of a shipped bundle name or a path to a bundle folder."""
    text = str(bundle)
    if "/" not in text and "\\" not in text and (shipped_folder(text) / MANIFEST).is_file():
        return shipped_folder(text)
    path = Path(text).expanduser()
    if (path / MANIFEST).is_file():
        return path.resolve()
    if path.is_dir():
        raise BundleError(f"bundle folder {path} has no {MANIFEST}")
    raise BundleError(f"unknown bundle {text!r}: not a shipped bundle ({', '.join(shipped_bundles())}) "
                      "and not a folder")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(folder: Path) -> dict[str, Any]:
    """Parse and sanity-check a folder's `bundle.json`."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BundleError(f"cannot read {path}: {e}") from e
    for key in ("name", "version", "kind", "splits", "files"):
        if key not in manifest:
            raise BundleError(f"{path} lacks the required key {key!r}")
    for split, entry in manifest["splits"].items():
        if entry.get("file") and entry["file"] not in manifest["files"]:
            raise BundleError(f"{path}: split {split!r} uses {entry['file']!r}, which has no fingerprint in 'files'")
    return manifest


def verify_files(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Fail unless every data file exists and its sha256 matches the manifest."""
    for name, expected in manifest["files"].items():
        path = Path(folder) / name
        if not path.is_file():
            raise BundleError(f"bundle {manifest['name']!r}: data file {path} is missing")
        actual = file_sha256(path)
        if actual != expected:
            raise BundleError(f"bundle {manifest['name']!r}: data file {path} was altered: "
                              f"sha256 expected {expected}, actual {actual}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON Lines file, gzip-compressed when the name ends in `.gz`."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl_gz(path: Path, rows: Iterable[Mapping[str, Any]]) -> str:
    """Write rows as gzip JSON Lines reproducibly (no timestamp, no file name); returns the sha256."""
    text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    Path(path).write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def _import_kind(kind: str, folder: Path | None = None) -> type:
    module_name, _, attr = kind.partition(":")
    try:
        if module_name.endswith(".py") and folder is not None:
            module = _import_file(folder / module_name)  # a bundle folder's own code (`new` makes one)
        else:
            module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module.BUNDLE_CLASS
    except (ImportError, AttributeError) as e:
        raise BundleError(f"bundle kind {kind!r} cannot be imported: {e}") from e


def _import_file(path: Path) -> Any:
    """Import a bundle folder's own module file once (named after its folder so two folders never clash)."""
    import importlib.util
    import sys

    name = f"agentrl_bundle_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_bundle(bundle: str, train_split: str = "train", eval_split: str = "eval",
                server: Any = None, **options: Any) -> Bundle:
    """Load a shipped bundle by name (`gridsim`, `arith`) or a bundle folder by path.

    `server` (the env server's settings) is accepted and ignored; other keyword options go to the bundle's
    class (gridsim: `prompt_style`; arith: `data_file`, `prompt_key`, `label_key`). Unknown options raise
    TypeError; a missing or altered data file raises BundleError (a ValueError).
    """
    del server  # the server's settings, not the bundle's
    if bundle in GENERATED:
        return _import_kind(GENERATED[bundle])(train_split=train_split, eval_split=eval_split, **options)
    folder = bundle_folder(bundle)
    manifest = read_manifest(folder)
    cls = _import_kind(manifest["kind"], folder)
    allowed = dict(getattr(cls, "OPTIONS", {}))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        takes = ", ".join(sorted(allowed)) or "no options"
        raise TypeError(f"bundle {manifest['name']!r} got unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"it takes: {takes}")
    verify_files(folder, manifest)
    source = folder.parent.name if folder == shipped_folder(folder.parent.name) else str(folder)
    return cls.from_folder(folder, manifest, source=source, train_split=train_split, eval_split=eval_split,
                           **{**allowed, **options})


class FolderBundle(Bundle):
    """Shared plumbing for bundles served from a folder: split files, lazy loading, `spec()`.

    Subclasses set `OPTIONS` (and `DATA_OPTIONS`, those of them that change the data) and implement
    `task_info` and `episode`; `rows(split)` gives a split's records.
    """

    OPTIONS: dict[str, Any] = {}
    DATA_OPTIONS: tuple[str, ...] = ()

    def __init__(self, folder: Path, manifest: Mapping[str, Any], *, source: str, train_split: str = "train",
                 eval_split: str = "eval", **options: Any) -> None:
        self.folder = Path(folder)
        self.manifest = dict(manifest)
        self.name = manifest["name"]
        self.version = str(manifest["version"])
        self.source = source
        self.options = options
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._split_files = {s: e.get("file") for s, e in manifest["splits"].items()}
        self._counts = {s: int(e["count"]) for s, e in manifest["splits"].items()}
        for role, split in (("train_split", train_split), ("eval_split", eval_split)):
            if split not in self._counts:
                raise ValueError(f"bundle {self.name!r} has no split {split!r} for {role}; "
                                 f"splits are {sorted(self._counts)}")
        self.train_split, self.eval_split = train_split, eval_split

    @classmethod
    def from_folder(cls, folder: Path, manifest: Mapping[str, Any], **kwargs: Any) -> FolderBundle:
        return cls(folder, manifest, **kwargs)

    def splits(self) -> dict[str, int]:
        return dict(self._counts)

    def data_source(self) -> str:
        return str(self.folder)

    def rows(self, split: str) -> list[dict[str, Any]]:
        """A split's stored records (loaded once); KeyError for an unknown split."""
        if split not in self._counts:
            raise KeyError(f"bundle {self.name!r} has no split {split!r}; splits are {sorted(self._counts)}")
        if split not in self._rows:
            rows = read_jsonl(self.folder / self._split_files[split])
            if len(rows) != self._counts[split]:
                raise BundleError(f"bundle {self.name!r} split {split!r}: {len(rows)} rows, manifest says "
                                  f"{self._counts[split]}")
            self._rows[split] = rows
        return self._rows[split]

    def row(self, split: str, index: int) -> dict[str, Any]:
        rows = self.rows(split)
        if not isinstance(index, int) or not 0 <= index < len(rows):
            raise IndexError(f"bundle {self.name!r} split {split!r} has no task {index!r} (0..{len(rows) - 1})")
        return rows[index]

    def data_options(self) -> dict[str, Any]:
        return {k: self.options[k] for k in self.DATA_OPTIONS}

    def task_info(self, split: str, index: int) -> TaskInfo:  # pragma: no cover - subclasses override
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        return {"bundle": self.source, "train_split": self.train_split, "eval_split": self.eval_split,
                **self.options}
