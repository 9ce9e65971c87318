"""`python -m agentrl +recipe=NAME [overrides]`: compose the run's config with Hydra and run it."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from agentrl.config import register_configs
from agentrl.config.locate import conf_dir

register_configs()


# An absolute config_path: Hydra resolves a relative one against the module's package, which breaks
# under a console script and in an installed wheel.
@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    from agentrl.console import quiet_console, record_exit, tee_console, untee_console
    from agentrl.run import run

    # Hydra has set up the job's logging by now: the console's lines go to its log file in the run folder too.
    quiet_console()
    tee_console()
    try:
        return run(cfg)
    except SystemExit as exc:
        record_exit(exc)
        raise
    finally:
        untee_console()


def main() -> None:
    """Console-script entry point (`agentrl ...`)."""
    _hydra_main()


if __name__ == "__main__":
    main()
