#!/usr/bin/env bash
# Regenerates constraints.txt: the exact version of every package installed in the test venv, i.e. the set the
# suite passed on. The README's install line and scripts/test.sh install with `-c constraints.txt`, so a fresh
# machine resolves to these versions; pyproject.toml keeps the compatible ranges a library states.
#   bash scripts/constraints.sh            # freeze .venv (the venv scripts/test.sh makes), after the suite passed
#   bash scripts/constraints.sh PYTHON     # freeze another interpreter's environment
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
OUT="${CONSTRAINTS_OUT:-constraints.txt}"
TMP="$(mktemp)"
trap 'rm -f "$TMP"' EXIT
{
  echo "# Versions the test suite passed on (Python 3.11, CPU; 'bash scripts/test.sh' green)."
  echo "# Used as: pip install -c constraints.txt -e '.[dev]'. Regenerate: bash scripts/constraints.sh (README)."
  # agentrl itself and direct references (file/VCS URLs) can't be constraints; torch's local label (+cpu) is
  # dropped so that `torch==2.13.0` matches the CPU build on disk and on PyPI alike.
  "$PY" -m pip freeze --exclude-editable \
    | grep -v -i -E '^(agentrl|pip|setuptools|wheel)==' | grep -v ' @ ' | grep -v '^-e ' \
    | sed -E 's/^(torch==[^+]*)\+.*$/\1/' | LC_ALL=C sort -f
} > "$TMP"
mv "$TMP" "$OUT"
trap - EXIT
echo "wrote $OUT: $(grep -c '==' "$OUT") pins from $("$PY" -c 'import sys; print(sys.prefix)')"
