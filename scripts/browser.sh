#!/usr/bin/env bash
# The browser tests' browser: headless Chromium and its WebDriver from the distribution's packages (Debian:
# chromium, chromium-driver), installed when missing.  Run by scripts/test.sh; needs root or sudo for apt-get.
# Nothing here is fetched at the server's run time: the server never needs a browser.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "scripts/browser.sh: Chromium is missing and neither root nor sudo is available to install it" \
         "(apt-get install chromium chromium-driver); the browser tests will fail" >&2
    exit 1
  fi
  SUDO="sudo -n"
fi
echo "installing Chromium from the distribution's packages (chromium, chromium-driver)" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
