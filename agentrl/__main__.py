"""`python -m agentrl +recipe=NAME [overrides]`: compose the run's config with Hydra and run it.

`python -m agentrl eval [overrides]` evaluates a model instead (agentrl/eval_run.py), and
`python -m agentrl compare A B` pairs two eval results (agentrl/compare.py).
"""

from __future__ import annotations

import signal
import sys

import hydra
from omegaconf import DictConfig

from agentrl.config import register_configs
from agentrl.config.locate import conf_dir
from agentrl.interrupts import Terminated
from agentrl.interrupts import install as install_interrupts

register_configs()


def _job(task: str, cfg: DictConfig) -> float | None:
    from agentrl.console import quiet_console, record_exit, tee_console, untee_console

    # Hydra has set up the job's logging by now: the console's lines go to its log file in the run folder too.
    quiet_console()
    tee_console()
    try:
        if task == "eval":
            from agentrl.eval_run import run_eval

            return run_eval(cfg)
        from agentrl.run import run

        return run(cfg)
    except SystemExit as exc:
        record_exit(exc)
        raise
    finally:
        untee_console()


# An absolute config_path: Hydra resolves a relative one against the module's package, which breaks
# under a console script and in an installed wheel.
@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    return _job("train", cfg)


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _hydra_eval(cfg: DictConfig) -> float | None:
    return _job("eval", cfg)


def main() -> None:
    """Console-script entry point (`agentrl ...`, `agentrl eval ...`, `agentrl compare A B`)."""
    install_interrupts()  # SIGTERM ends a run as Ctrl-C does; neither lands inside a write to the store
    try:
        _dispatch()
    except Terminated:
        print("agentrl: stopped by SIGTERM", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGTERM) from None
    except KeyboardInterrupt:
        # The run has closed its MLflow run as KILLED and printed its closing block (with how to resume it): a
        # traceback through Hydra and torch would only bury that. 130: the shell's code for a SIGINT stop.
        print("agentrl: stopped by Ctrl-C", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


def _dispatch() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "compare":
        from agentrl.compare import main as compare

        raise SystemExit(compare(sys.argv[2:]))
    if command == "eval":
        # An evaluation's run folder is runs/eval/<time> unless the command line names its task_name.
        rest = sys.argv[2:]
        named = any(a.startswith("task_name=") for a in rest)
        sys.argv = [sys.argv[0], *([] if named else ["task_name=eval"]), *rest]
        _hydra_eval()
        return
    _hydra_main()


if __name__ == "__main__":
    main()
