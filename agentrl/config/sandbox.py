"""Schemas of the `sandbox` group: where an episode's env runs."""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config.numbers import check_counts, check_finite


@dataclass
class SandboxConfig:
    kind: str = "local"


@dataclass
class LocalSandboxConfig(SandboxConfig):
    kind: str = "local"


@dataclass
class DockerSandboxConfig(SandboxConfig):
    kind: str = "docker"
    image: str = "agentrl-sandbox:latest"  # built by `python -m agentrl.envs.sandbox.image build`
    warm_pool: int = 0  # containers started ahead of time, off each rollout's critical path
    memory: str = "512m"  # per-container memory limit
    cpus: float = 1.0  # per-container CPU limit
    network: str = "none"  # none: no network at all, so 128 episodes need no networks
    # Seconds one Docker API call (create, start, inspect, remove) may wait for the daemon's reply before the daemon
    # counts as not answering: a frozen or wedged dockerd fails a reset after about this long, naming the daemon.
    docker_timeout: float = 30.0

    def __post_init__(self) -> None:
        check_counts("sandbox", self, ("warm_pool",), minimum=0)
        check_finite("sandbox", self, ("cpus", "docker_timeout"), positive=True)
