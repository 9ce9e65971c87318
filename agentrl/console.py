"""A quiet console whose every line also lands in the run folder's log (Hydra's job log, `__main__.log`).

`quiet_console()` (run once per process by the CLI and by TRL's workers): each warning is shown once and goes
through logging (so into the log file too), known noise is dropped (`NOISE`), and transformers' and the hub's
per-file progress bars are off. `tee_console()` copies what the console shows with print() (the plan, the
evaluation lines, the closing block) into the log file. `progress()` writes a line to the log file only: the
step progress the console shows as a progress bar.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from typing import Any, TextIO

# Known noise: (category, message regex) of warnings that say nothing a user can act on in an agentrl run.
NOISE: tuple[tuple[type[Warning], str], ...] = (
    # transformers 5.2x renamed gradient checkpointing; TRL and accelerate still pass the old name.
    (FutureWarning, r"`gradient_checkpointing(_kwargs)?` is deprecated"),
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
    # torch's checkpoint and autocast spellings that transformers and TRL use internally.
    (FutureWarning, r"`torch\.cpu\.amp\.autocast\(args\.\.\.\)` is deprecated"),
    (UserWarning, r"To copy construct from a tensor, it is recommended"),
    # accelerate on a CPU-only box, and pydantic/mlflow deprecations raised inside libraries.
    (UserWarning, r".*torch\.cuda\.amp.*"),
)
# TRL prints its experimental-API notice from every process; the parent shows it once (see `trl_env`).
TRL_SILENCE = "TRL_EXPERIMENTAL_SILENCE"
CONSOLE_LOGGER = "agentrl.console"
PROGRESS_LOGGER = "agentrl.progress"


def quiet_console() -> None:
    """Show each warning once, through logging; drop `NOISE`; turn off per-file progress bars. Idempotent.

    Filters set on the command line (`python -W ...`, PYTHONWARNINGS) are left as they are.
    """
    if not sys.warnoptions:
        # Python already hides DeprecationWarning outside __main__; what it shows, it shows once per text, not
        # once per call site (a library's deprecation reached from a hundred places is one line).
        for category in (UserWarning, FutureWarning, RuntimeWarning):
            warnings.filterwarnings("once", category=category)
        for category, message in NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
    logging.captureWarnings(True)
    # "Loading weights" / "Writing model shards" bars for every model load and save (dozens in a run).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    # One INFO line per request (every chat turn, every session) would drown the progress bars; an MCP env the
    # run serves logs one per request too ("Processing request of type ListToolsRequest", every episode).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("mcp.server").setLevel(logging.WARNING)


def _file_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


def _file_only(name: str) -> logging.Logger:
    """A logger that writes to the root logger's files (Hydra's job log) and never to the console."""
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for handler in _file_handlers():
        if handler not in logger.handlers:
            logger.addHandler(handler)
    return logger


def progress(message: str, *args: Any) -> None:
    """A progress line for the log file only (the console shows a progress bar instead)."""
    _file_only(PROGRESS_LOGGER).info(message, *args)


class _Tee(io.TextIOBase):
    """A text stream that writes through to `stream` and sends each complete line to a file-only logger."""

    def __init__(self, stream: TextIO, logger: logging.Logger) -> None:
        self._stream, self._logger, self._line = stream, logger, ""

    def write(self, s: str) -> int:
        n = self._stream.write(s)
        self._line += s
        *done, self._line = self._line.split("\n")
        for line in done:
            line = line.rsplit("\r", 1)[-1].rstrip()  # a line redrawn with \r: what it finally showed
            if line:
                self._logger.info(line)
        return n

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tee_console() -> None:
    """Copy every line printed to stdout into the run's log file too (no-op without one; idempotent)."""
    if not _file_handlers() or isinstance(sys.stdout, _Tee):
        return
    sys.stdout = _Tee(sys.stdout, _file_only(CONSOLE_LOGGER))


def untee_console() -> None:
    """Give stdout back (the end of a job: the next job of a multirun has its own log file)."""
    if isinstance(sys.stdout, _Tee):
        sys.stdout.flush()
        sys.stdout = sys.stdout._stream
    for name in (CONSOLE_LOGGER, PROGRESS_LOGGER):
        logging.getLogger(name).handlers.clear()


def record_exit(exc: SystemExit) -> None:
    """Put the one-line reason a job stops (`agentrl: ...`, printed to stderr) into the log file too."""
    if isinstance(exc.code, str):
        _file_only(CONSOLE_LOGGER).error(exc.code)


def run_relayed(command: list[str], **kwargs: Any) -> int:
    """Run `command` with its stdout and stderr relayed line by line to this process's stdout (and so to the
    run's log, `tee_console`); returns its exit code."""
    import subprocess

    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                          errors="replace", **kwargs) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
        return proc.wait()
