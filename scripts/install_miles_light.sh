#!/usr/bin/env bash
# Miles' agentic path on a CPU (CI, laptops): miles-rl without its dependency tree, plus only the light
# packages that path imports. `pip install miles-rl==0.0.2` with dependencies would pull torch 2.14 + CUDA
# (GBs) and replace the project's torch; --no-deps keeps torch, transformers, fastapi, pydantic, mlflow and
# numpy exactly as they are. The list matches pyproject.toml's `miles` extra (keep them in sync).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# The tested versions (constraints.txt, as for agentrl itself) when run from a checkout that has them.
C=()
[ -f constraints.txt ] && C=(-c constraints.txt)
"$PY" -m pip install -q "${C[@]}" --no-deps "miles-rl==0.0.2" "miles-tito-tokenizers==0.1.1"
# openai + ipython: the vendored sglang protocol module imports them (miles-rl does not declare them).
# setproctitle, pybase64: session server and sglang utils; ray: miles.utils.misc at import; pylatexenc:
# rm_hub; sglang-router, partial-json-parser: the rollout loop and the function-call parser.
"$PY" -m pip install -q "${C[@]}" "openai>=1.0" "ipython>=8" "setproctitle>=1.3" "pybase64>=1.4" "ray==2.60.0" \
  "pylatexenc>=2.10" "sglang-router==0.3.2" "partial-json-parser>=0.2"
"$PY" - <<'PY'
import importlib
for m in ("miles.rollout.generate_hub.agentic_tool_call", "miles.rollout.session.session_server",
          "miles.rollout.inference_rollout.inference_rollout_train"):
    importlib.import_module(m)
import torch
print(f"Miles (light) ready; torch {torch.__version__} untouched")
PY
