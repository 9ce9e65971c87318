#!/usr/bin/env bash
# Rehearses the GPU check here, without a GPU: proves that the image's packages plus the carried wheels are all
# agentrl needs, so the one device call cannot fail on a missing module.
#
#   1. scripts/gpu_wheels.sh for this machine's Python (3.11) into a folder of its own (.whl/ is left alone);
#   2. a fresh venv under /tmp (no system site packages) holding only image-like packages: torch 2.13.0 (the local
#      CPU build), transformers 5.17.0 (the image's), and what else of the image's list our closure needs (from the
#      wheel folder's image-side.txt); anything pip pulls in that the image does not have is removed again;
#   3. scripts/gpu_check.sh in CPU smoke mode with that venv's python first on PATH, agentrl NOT installed (run from
#      the checkout), the wheels installed by the check itself with the device's exact command.
# Usage: bash scripts/gpu_rehearsal.sh     (about 4 minutes here, most of it pip)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PY="${GPU_REHEARSAL_PYTHON:-python3.11}"
VENV="${GPU_REHEARSAL_VENV:-/tmp/agentrl-gpu-rehearsal-venv}"
WHEELS="${GPU_REHEARSAL_WHEELS:-/tmp/agentrl-gpu-rehearsal-wheels}"
# The image's versions where the device notes give them (scripts/gpu_image_packages.txt); torch is the local CPU
# build (never another version: it would pull gigabytes), the rest whatever pip picks.
# typing-extensions 4.12.2 plays an image older than our closure wants (the wheels carry a newer one).
PINS=(torch==2.13.0 transformers==5.17.0 tokenizers==0.23.2 huggingface-hub==1.33.0 safetensors==0.8.0
  typing-extensions==4.12.2)
started=$(date +%s)
lap() { echo "-- $1 ($(( $(date +%s) - started ))s)"; }

ver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
lap "1. wheels for Python $ver -> $WHEELS"
bash scripts/gpu_wheels.sh "$ver" "$WHEELS"

lap "2. image-like venv $VENV"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
grep -v '^#' "$WHEELS/image-side.txt" > "$VENV/image-side.txt"
"$VENV/bin/python" -m pip install -q "${PINS[@]}" -r "$VENV/image-side.txt" 2>&1 | grep -v "is ignored: it is neither" || true
# What pip pulled in beyond the image's list would hide a wheel we forgot to carry: remove it.
extra="$("$VENV/bin/python" - scripts/gpu_image_packages.txt <<'PY'
import re, sys
from importlib.metadata import distributions
from pathlib import Path

norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = {norm(x.strip()) for x in Path(sys.argv[1]).read_text().splitlines() if x.strip() and not x.startswith("#")}
print(" ".join(sorted({norm(d.metadata["Name"]) for d in distributions()} - image)))
PY
)"
if [ -n "$extra" ]; then
  echo "not on the image, removed from the venv: $extra"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip uninstall -q -y $extra
fi
# From outside the checkout (inside it, the current folder makes agentrl importable, as the check relies on).
(cd / && "$VENV/bin/python" -c "import agentrl" 2>/dev/null) && { echo "rehearsal: agentrl is installed in the venv"; exit 1; }
(cd / && "$VENV/bin/python" -c "import hydra" 2>/dev/null) && { echo "rehearsal: hydra is in the venv without the wheels"; exit 1; }
"$VENV/bin/python" -c "import torch, transformers; print('venv: torch', torch.__version__, '| transformers', transformers.__version__)"

lap "3. scripts/gpu_check.sh (cpu smoke) with the venv's python and the wheels"
rc=0
(cd "$REPO" && env -u PYTHONPATH PATH="$VENV/bin:$PATH" GPU_CHECK_DEVICE=cpu GPU_CHECK_SMALL=1 GPU_CHECK_WHEELS="$WHEELS" \
  bash scripts/gpu_check.sh) || rc=$?
lap "rehearsal: gpu_check.sh exit $rc"
exit "$rc"
