"""Fixtures shared by the env tests: a real Docker daemon (with the sandbox image) for the Docker tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def docker_client():
    """A Docker SDK client; skips (fails when AGENTRL_REQUIRE_DOCKER=1) without a daemon."""
    docker = pytest.importorskip("docker")
    try:
        c = docker.from_env(timeout=30)
        c.ping()
    except Exception as exc:
        if os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":  # CI: a missing daemon is a failure, not a skip
            pytest.fail(f"AGENTRL_REQUIRE_DOCKER=1 but no Docker daemon answers ({exc})")
        pytest.skip(f"no Docker daemon answers ({exc}); run `bash .ci/setup_docker.sh`")
    from agentrl.envs.sandbox.image import DEFAULT_IMAGE, ensure_image

    ensure_image(DEFAULT_IMAGE)  # a no-op in CI, where setup_docker.sh built it
    yield c
    c.close()
