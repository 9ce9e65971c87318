#!/usr/bin/env bash
# Install headless Chromium (Debian's chromium, with a font so pages draw their text) for the MLflow run-page test
# (tests/tracking/test_run_page_first_screen.py) and scripts/mlflow_screenshots.py; a no-op when it is there.
#   bash .ci/setup_chromium.sh        (as root on Debian; CI runs it before pytest)
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "[setup_chromium] $(chromium --version 2>/dev/null || chromium-browser --version) already installed"
  exit 0
fi
packages=(chromium fonts-liberation)
echo "[setup_chromium] installing ${packages[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${packages[@]}" >/tmp/setup_chromium_apt.log 2>&1 || {
  apt-get update >>/tmp/setup_chromium_apt.log 2>&1
  apt-get install -y --no-install-recommends "${packages[@]}" >>/tmp/setup_chromium_apt.log 2>&1 || {
    tail -20 /tmp/setup_chromium_apt.log; exit 1; }
}
echo "[setup_chromium] $(chromium --version)"
