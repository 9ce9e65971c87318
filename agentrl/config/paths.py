"""Schema of the `paths` group: where run output lands, rooted at a known place, never the CWD."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PathsConfig:
    # $AGENTRL_HOME; else the nearest folder from the working folder up holding recipes/; else the checkout;
    # else ~/agentrl (agentrl/config/locate.py).
    root: str = "${agentrl_root:}"
    output_root: str = "${.root}/outputs"
    run_root: str = "${.output_root}/runs"
    model_dir: str = "${.output_root}/models"
    data_dir: str = "${.output_root}/data"
    checkpoint_dir: str = "${.output_root}/checkpoints"
