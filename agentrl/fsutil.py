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
