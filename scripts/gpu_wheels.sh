#!/usr/bin/env bash
# The wheels agentrl needs on the lent GPU machine beyond what its image already holds.
#
# Reads [project].dependencies from pyproject.toml, drops the projects the image has (scripts/gpu_image_packages.txt),
# resolves the rest's closure for CPython PYTHON_VERSION on manylinux x86_64, and downloads only the closure's
# projects that the image lacks into OUT_DIR (emptied first). OUT_DIR/image-side.txt lists what the image must
# provide for them (the rehearsal installs those). Fails when the wheels exceed GPU_WHEELS_LIMIT_MIB (48).
#
# Usage: bash scripts/gpu_wheels.sh [PYTHON_VERSION (3.12)] [OUT_DIR (.whl, or $GPU_WHEELS_DIR)]
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
OUT="${2:-${GPU_WHEELS_DIR:-.whl}}"
LIMIT_MIB="${GPU_WHEELS_LIMIT_MIB:-48}"
IMAGE_LIST="scripts/gpu_image_packages.txt"
# Dependencies published as source only: built here into a pure-Python wheel first.
SDIST_ONLY=("antlr4-python3-runtime==4.9.3")
# Image projects carried all the same: small, backward compatible, and our closure wants a newer one than an image
# may hold (pydantic 2.14 needs typing-extensions>=4.16). On PYTHONPATH they shadow the image's copy.
export GPU_WHEELS_CARRY_ANYWAY="${GPU_WHEELS_CARRY_ANYWAY:-typing-extensions}"
PLATFORMS=(--implementation cp --python-version "$PYV" --only-binary=:all:
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)

case "$OUT" in ""|/|.|..) echo "gpu_wheels: refusing to empty '$OUT'" >&2; exit 2;; esac
TMP="$(mktemp -d /tmp/agentrl-gpu-wheels.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
started=$(date +%s)

# Split pyproject's dependencies: the image's (named in image-side.txt) and the rest (to resolve).
python3 - "$IMAGE_LIST" "$TMP" <<'PY'
import re, sys, tomllib
from pathlib import Path

image_list, tmp = Path(sys.argv[1]), Path(sys.argv[2])
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # PEP 503
image = {norm(line.strip()) for line in image_list.read_text().splitlines() if line.strip() and not line.startswith("#")}
deps = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
ours, theirs = [], []
for dep in deps:
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", dep).group(1)
    (theirs if norm(name) in image else ours).append(dep)
(tmp / "ours.txt").write_text("\n".join(ours) + "\n")
(tmp / "theirs.txt").write_text("\n".join(theirs) + "\n")
print(f"pyproject: {len(deps)} dependencies; on the image: {', '.join(theirs)}")
PY

mkdir -p "$TMP/links"
python3 -m pip wheel -q --no-deps --no-cache-dir -w "$TMP/links" "${SDIST_ONLY[@]}" 2>&1 | grep -v "is ignored: it is neither" || true
python3 -m pip install -q --dry-run --ignore-installed --report "$TMP/report.json" --target "$TMP/target" \
  --find-links "$TMP/links" "${PLATFORMS[@]}" -r "$TMP/ours.txt" 2>&1 | grep -v "is ignored: it is neither" || true
[ -s "$TMP/report.json" ] || { echo "gpu_wheels: pip could not resolve the dependencies for Python $PYV" >&2; exit 1; }

# Pin the closure's projects the image lacks; list the ones it must provide.
python3 - "$IMAGE_LIST" "$TMP" <<'PY'
import json, os, re, sys
from pathlib import Path

image_list, tmp = Path(sys.argv[1]), Path(sys.argv[2])
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = {norm(line.strip()) for line in image_list.read_text().splitlines() if line.strip() and not line.startswith("#")}
closure = {(norm(i["metadata"]["name"]), i["metadata"]["version"])
           for i in json.loads((tmp / "report.json").read_text())["install"]}
anyway = {norm(n) for n in os.environ["GPU_WHEELS_CARRY_ANYWAY"].split()}
carry = sorted(f"{n}=={v}" for n, v in closure if n not in image or n in anyway)
needed = sorted(n for n, _ in closure if n in image)
(tmp / "carry.txt").write_text("\n".join(carry) + "\n")
top = (tmp / "theirs.txt").read_text().split()
top_names = {norm(re.match(r"[A-Za-z0-9._-]+", t).group(0)) for t in top}
(tmp / "image-side.txt").write_text(
    "# What the image must provide for agentrl and the carried wheels (pyproject's own, then the closure's).\n"
    + "\n".join(top + [n for n in needed if n not in top_names]) + "\n")
print(f"closure for this Python: {len(closure)} projects; the image has {len(needed)}, {len(carry)} to carry")
PY

rm -rf "$OUT" && mkdir -p "$OUT"
python3 -m pip download -q --no-deps --find-links "$TMP/links" "${PLATFORMS[@]}" -d "$OUT" -r "$TMP/carry.txt" \
  2>&1 | grep -v "is ignored: it is neither" || true
cp "$TMP/image-side.txt" "$OUT/image-side.txt"

# Check: every pinned project arrived as exactly one wheel, none of them the image's (but those carried anyway).
python3 - "$IMAGE_LIST" "$TMP/carry.txt" "$OUT" "$LIMIT_MIB" <<'PY'
import os, re, subprocess, sys
from pathlib import Path

image_list, carry, out, limit = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = {norm(line.strip()) for line in image_list.read_text().splitlines() if line.strip() and not line.startswith("#")}
wheels = sorted(out.glob("*.whl"))
names = [norm(w.name.split("-")[0]) for w in wheels]
wanted = {norm(line.split("==")[0]) for line in carry.read_text().split()}
problems = []
if missing := wanted - set(names):
    problems.append(f"not downloaded: {sorted(missing)}")
if dupes := {n for n in names if names.count(n) > 1}:
    problems.append(f"two versions of: {sorted(dupes)}")
if on_image := set(names) & image - {norm(n) for n in os.environ["GPU_WHEELS_CARRY_ANYWAY"].split()}:
    problems.append(f"on the image already: {sorted(on_image)}")
size = sum(w.stat().st_size for w in wheels) / 2**20
print(f"{len(wheels)} wheels, {size:.1f} MiB in {out}")
# What a device call sends: the working tree (tracked and untracked-not-ignored files) plus the carried folder.
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, text=True).stdout
tree = sum(Path(f).stat().st_size for f in files.split("\0") if f and Path(f).is_file()) / 2**20
print(f"a device call with carry=['{out}'] sends {tree:.1f} MiB of working tree + {size:.1f} MiB of wheels "
      f"(limit 64 MiB)")
if size > limit:
    problems.append(f"{size:.1f} MiB is over the {limit:.0f} MiB budget (the working tree travels too, 64 MiB in all)")
if problems:
    sys.exit("gpu_wheels: " + "; ".join(problems))
PY
echo "gpu_wheels: done in $(( $(date +%s) - started ))s"
