"""What every child process a run starts beside itself shares (the engine's, the env server's): it dies with the run."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux's PR_SET_PDEATHSIG); elsewhere a no-op,
    and the child's closed pipe still ends it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
