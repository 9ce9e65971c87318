"""`model.chat_template=<file>`: a model served and trained through a chat template of the user's choosing.

Every part of agentrl (the session server, the learner, the SFT warm start, vLLM, TRL) loads the tokenizer from
the model's folder, so the template is not patched into each loader: the model is used through a folder that
links every file of the original and holds the given template instead of the original's. The weights are never
copied. One folder per (model folder, template), made once under `model.template_dir`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from agentrl.fsutil import atomic_dir, file_lock

TEMPLATE_FILE = "chat_template.jinja"
MARKER = "agentrl_template.json"


def read_template(template_file: str | Path) -> str:
    """The template text of `model.chat_template`, compiled once to refuse a file that is not valid Jinja."""
    path = Path(template_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"model.chat_template={str(template_file)!r} is not a file")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"model.chat_template={str(template_file)!r} is empty")
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(text)
    except Exception as exc:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ValueError(f"model.chat_template={str(template_file)!r} is not a valid Jinja template{where}: "
                         f"{exc}") from exc
    return text


def with_chat_template(folder: str | Path, template_file: str | Path, template_dir: str | Path | None = None) -> str:
    """A folder that is `folder` with the template in `template_file` (made under `template_dir`, by default
    `with_template/` beside `folder`, if missing)."""
    source = Path(folder).expanduser().absolute()
    template_dir = template_dir or source.parent / "with_template"
    template = read_template(template_file)
    digest = hashlib.sha256(f"{source}\n{template}".encode()).hexdigest()[:12]
    target = Path(template_dir).expanduser().absolute() / f"{source.name}-{digest}"
    record = {"source": str(source), "template": str(Path(template_file).expanduser().absolute())}
    if _is_made(target, record):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if _is_made(target, record):
            return str(target)
        with atomic_dir(target, tag="linking") as tmp:
            _link(source, tmp, template)
            (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    return str(target)


def _is_made(target: Path, record: dict[str, str]) -> bool:
    try:
        return json.loads((target / MARKER).read_text()) == record
    except (OSError, ValueError):
        return False


def _link(source: Path, out: Path, template: str) -> None:
    for entry in source.iterdir():
        if entry.name in (TEMPLATE_FILE, MARKER, "chat_template.json"):
            continue
        if entry.name == "tokenizer_config.json":
            # transformers reads a template from here too; the folder must hold exactly one.
            config = json.loads(entry.read_text(encoding="utf-8"))
            config.pop("chat_template", None)
            (out / entry.name).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
            continue
        os.symlink(entry.resolve(), out / entry.name)
    (out / TEMPLATE_FILE).write_text(template, encoding="utf-8")
