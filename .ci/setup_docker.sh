#!/usr/bin/env bash
# Make a Docker daemon answer and build the sandbox image; safe to run again (each step is skipped when done).
#   bash .ci/setup_docker.sh        (as root on Debian; CI runs it before pytest)
# Env: PYTHON (default python3), DOCKERD_LOG (default /tmp/dockerd.log), DOCKERD_WAIT_S (default 60),
#      SANDBOX_IMAGE (default agentrl-sandbox:latest).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DOCKERD_LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
DOCKERD_WAIT_S="${DOCKERD_WAIT_S:-60}"
SANDBOX_IMAGE="${SANDBOX_IMAGE:-agentrl-sandbox:latest}"
t0=$SECONDS
say() { echo "[setup_docker +$((SECONDS - t0))s] $*"; }

# 1. Packages: Debian's docker.io (daemon + CLI) and debootstrap (builds the image's root filesystem).
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/setup_docker_apt.log 2>&1 || {
    apt-get update >>/tmp/setup_docker_apt.log 2>&1
    apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/setup_docker_apt.log 2>&1 || {
      tail -20 /tmp/setup_docker_apt.log; exit 1; }
  }
fi

# 2. The daemon: start one in the background unless one already answers.
if docker info >/dev/null 2>&1; then
  say "a Docker daemon already answers"
else
  say "starting dockerd (log: $DOCKERD_LOG)"
  nohup dockerd >"$DOCKERD_LOG" 2>&1 &
  for ((i = 0; i < DOCKERD_WAIT_S * 2; i++)); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not answer within ${DOCKERD_WAIT_S}s; last lines of $DOCKERD_LOG:" >&2
    tail -30 "$DOCKERD_LOG" >&2
    exit 1
  fi
  say "dockerd answers (storage driver: $(docker info --format '{{.Driver}}'))"
fi

# 3. The sandbox image (a no-op when it is current; the root filesystem tar is cached per machine).
"$PYTHON" -m agentrl.envs.sandbox.image build --name "$SANDBOX_IMAGE"
say "done"
