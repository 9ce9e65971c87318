"""Fixtures: the real env server for the shipped bundles, served on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.server import build_app, serve_in_background


@pytest.fixture(scope="session")
def gridsim_bundle():
    return load_bundle("gridsim")


@pytest.fixture(scope="session")
def arith_bundle():
    return load_bundle("arith")


@pytest.fixture(scope="module")
def gridsim_url(gridsim_bundle) -> Iterator[str]:
    with serve_in_background(build_app(gridsim_bundle, max_concurrent_envs=16, tool_timeout=10)) as url:
        yield url


@pytest.fixture(scope="module")
def arith_url(arith_bundle) -> Iterator[str]:
    with serve_in_background(build_app(arith_bundle, max_concurrent_envs=32, tool_timeout=10)) as url:
        yield url

