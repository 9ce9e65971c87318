#!/usr/bin/env bash
# The test command: installs agentrl with its test peers (and Miles' light CPU path), makes sure a Docker engine answers (the Docker
# sandbox tests run against a real one), and runs the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[dev]'
# Miles' agentic path runs for real in the tests, on the CPU: the light install (never its CUDA torch).
bash scripts/install_miles_light.sh
if [ -n "${CI:-}" ]; then
  # In CI the Docker tests must run, never skip.
  bash .ci/setup_docker.sh
  export AGENTRL_REQUIRE_DOCKER=1
elif [ -f .ci/setup_docker.sh ] && [ "$(id -u)" = 0 ]; then
  bash .ci/setup_docker.sh || echo "warning: no Docker engine; the Docker sandbox tests will skip" >&2
fi
exec python3 -m pytest -q "$@"
