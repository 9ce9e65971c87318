"""References into benchmarks/RESULTS.md resolve, and the docs' relative links point to files that exist.

A result is cited in two ways, anywhere in the repository (README, docs, recipes' and configs' comments, code,
benchmarks, tests): by the first words of a RESULTS heading in double quotes right after the file's name (the
quote may run over a comment's line break; a locator such as `issue 33 proof 1,` may come between), or by a
markdown link to a heading's anchor (`RESULTS.md#...`). A heading renamed without its references fails here,
naming the file and the reference. Anchors follow GitHub's rule: the heading's text lowercased, punctuation
other than `-` and `_` dropped, spaces turned into `-`, a repeated anchor suffixed `-1`, `-2`, ...
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SCANNED = ("README.md", "docs", "recipes", "conf", "agentrl", "benchmarks", "tests", "scripts", ".ci")
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".toml", ".txt", ""}
SKIPPED = {Path(__file__).resolve()}  # this file's docstring shows the reference styles
SKIPPED_DIRS = {"__pycache__", "openenv_examples", ".venv", "outputs", "node_modules"}
# the docs whose relative links must point to an existing file (and a heading, for a `.md#anchor`)
LINKED_DOCS = ("README.md", "docs/*.md", "benchmarks/*.md", "benchmarks/data/*/README.md")
MAX_HEADING = 90  # RESULTS.md's headings stay short: the figure and the verdict go in the section's first line

FENCE = re.compile(r"^\s*```")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# `RESULTS.md, "Heading"`, `RESULTS.md "Heading"`, `RESULTS.md` ("Heading")`, `RESULTS, issue 33 proof 1, "Heading"`,
# and a second quote after `and` or a comma
QUOTED = re.compile(
    r"RESULTS(?:\.md)?`?[ ,:]*\(?\s*(?:(?i:issue) \d+(?:'s)? (?i:proof) \d+[,:]?\s*)?"
    r'"([^"\n]{1,300})"((?:\s*,?\s*(?:and\s+)?"[^"\n]{1,300}")*)')
ANCHOR_REF = re.compile(r"RESULTS\.md#([\w\-]+)")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HTML_ANCHOR = re.compile(r'<a\s+(?:id|name)="([^"]+)"')
ENUMERATOR = re.compile(r"^\(\d+\)\s*")  # "(3) The flagship ..." is cited as "The flagship ..."


def headings(text: str) -> list[str]:
    """Markdown headings outside fenced code blocks, their text as written."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append(m.group(2))
    return out


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """A markdown file's anchors: its headings' (GitHub's rule) and any `<a id="...">` it sets itself."""
    text = path.read_text()
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for h in headings(text):
        base = slug(h)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("*", "").replace("`", "")).strip().casefold()


def resolves(quote: str, heads: list[str]) -> bool:
    """The quote is a heading's first words (whole words, case and markdown emphasis aside)."""
    q = norm(quote)
    for h in heads:
        for form in {norm(h), norm(ENUMERATOR.sub("", h))}:
            if form.startswith(q) and (len(form) == len(q) or not form[len(q)].isalnum()):
                return True
    return False


def scanned_files() -> Iterator[Path]:
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for p in paths:
            if (p.is_file() and p.suffix in SUFFIXES and p.resolve() not in SKIPPED and p != RESULTS
                    and not SKIPPED_DIRS.intersection(p.relative_to(ROOT).parts)):
                yield p


def joined(text: str) -> str:
    """The text with each line's indentation and comment or heading marks dropped, lines joined by a space, so a
    quote that runs over a comment's line break reads as one."""
    return " ".join(re.sub(r"^\s*#*\s*", "", line) for line in text.splitlines())


def scanned_texts() -> list[tuple[Path, str]]:
    """Each scanned file's text (binary files skipped)."""
    out = []
    for path in scanned_files():
        try:
            out.append((path, path.read_text()))
        except UnicodeDecodeError:
            continue
    return out


def quoted_refs() -> list[tuple[Path, str]]:
    refs = []
    for path, text in scanned_texts():
        if "RESULTS" not in text:
            continue
        for m in QUOTED.finditer(joined(text)):
            refs.append((path, m.group(1)))
            refs += [(path, q) for q in re.findall(r'"([^"]+)"', m.group(2))]
    return refs


def anchor_refs() -> list[tuple[Path, str]]:
    return [(path, a) for path, text in scanned_texts() for a in ANCHOR_REF.findall(text)]


def linked_docs() -> list[Path]:
    return sorted({p for pattern in LINKED_DOCS for p in ROOT.glob(pattern)})


def links(text: str) -> list[str]:
    """Markdown link targets outside code: fenced blocks and inline code spans are left out."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_scan_finds_the_references() -> None:
    """The patterns still see the repository's references, so the checks below cannot pass by finding nothing."""
    quoted = quoted_refs()
    assert len(quoted) >= 30, quoted
    assert (ROOT / "README.md", "The flagship at >= 0.95") in quoted
    # a quote over a comment's line break, after a locator
    assert any(p.name == "gridsim_beat_teacher.yaml" and q == "A faithful imitation of the rule" for p, q in quoted)
    assert len(headings(RESULTS.read_text())) > 50


def test_every_quoted_results_heading_resolves() -> None:
    heads = headings(RESULTS.read_text())
    broken = [f'{rel(p)}: "{q}"' for p, q in quoted_refs() if not resolves(q, heads)]
    assert not broken, ("no heading of benchmarks/RESULTS.md starts with these words (a renamed heading? update "
                        "the reference):\n" + "\n".join(broken))


def test_every_results_anchor_resolves() -> None:
    known = anchors(RESULTS)
    broken = [f"{rel(p)}: RESULTS.md#{a}" for p, a in anchor_refs() if a not in known]
    assert not broken, "no heading of benchmarks/RESULTS.md has these anchors:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", linked_docs(), ids=rel)
def test_relative_links_point_to_files(doc: Path) -> None:
    broken = []
    for target in links(doc.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        where, _, anchor = target.partition("#")
        dest = (doc.parent / where).resolve() if where else doc
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading in {dest.name})")
    assert not broken, f"{rel(doc)}: broken links:\n" + "\n".join(broken)


def test_the_index_links_every_doc() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    listed = {Path(t.partition("#")[0]).name for t in links(index)}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list: {missing}"
    readme = links((ROOT / "README.md").read_text())
    assert "docs/README.md" in readme and "docs/architecture.md" in readme, readme


def test_results_headings_are_short() -> None:
    long = [h for h in headings(RESULTS.read_text()) if len(norm(h)) > MAX_HEADING]
    assert not long, (f"headings over {MAX_HEADING} characters (move the figure and the verdict into the section's "
                      "first line):\n" + "\n".join(long))
