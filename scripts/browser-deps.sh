#!/usr/bin/env bash
# Headless Chromium and its WebDriver, for the chat page's test
# (tests/serve/test_page.py, run by crates/onebit/tests/page.rs), from
# Debian's packages. Idempotent: nothing happens when both are installed.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq </dev/null
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver </dev/null >/dev/null
