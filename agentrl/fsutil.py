"""Folders written whole or not at all: a temporary sibling, renamed into place when complete.

A reader (another run reusing a cached model, a resume after a kill) never sees a half-written folder: until the
rename, the previous folder (or none) is what is there. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_dir(target: str | Path, tag: str = "tmp") -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; when the block ends without error it replaces `target`.

    An existing `target` is moved aside before the rename and removed after it, so the only moment without a
    complete folder is between two renames. On any error the temporary folder is removed and the error raised,
    leaving `target` untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{tag}-", dir=target.parent))
    try:
        yield tmp
        old = target.with_name(f".{target.name}.old")
        moved = target.exists()
        if moved:
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except OSError:
            if moved:  # put the previous folder back: a failed replace must leave what was there
                os.rename(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """An exclusive advisory lock on the file `path` (made if missing), held for the block: one builder of a
    cached folder at a time across processes."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the atomic rename alone still keeps readers safe
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def make_readable(folder: str | Path) -> None:
    """Open a built folder and its files to everyone the umask allows: mkdtemp (and some writers) create
    owner-only entries, and cached models are shared with sandboxes and other users."""
    folder = Path(folder)
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)
