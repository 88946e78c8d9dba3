#!/usr/bin/env bash
# Install Debian's Chromium for the real-browser tests (tests/browser/) when it is missing.
# Never fails the build: when it cannot install (not root, no apt-get, no network) it says why and exits 0,
# and the browser tests then skip with their own printed reason.
set -u
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}

if [ -x "$CHROMIUM" ]; then
    echo "install_browser: $CHROMIUM is already installed ($("$CHROMIUM" --version 2>/dev/null || echo 'version unknown'))."
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install_browser: $CHROMIUM is missing and we are not root; the browser tests will be skipped." \
         "Install it with: sudo apt-get install -y chromium"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: $CHROMIUM is missing and apt-get is not available; the browser tests will be skipped."
    exit 0
fi
echo "install_browser: installing Debian's chromium with apt-get (a few minutes the first time)..."
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq; then
    echo "install_browser: apt-get update failed; the browser tests will be skipped."
    exit 0
fi
if ! apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; then
    echo "install_browser: apt-get install chromium failed; the browser tests will be skipped."
    exit 0
fi
if [ -x "$CHROMIUM" ]; then
    echo "install_browser: installed $("$CHROMIUM" --version 2>/dev/null)."
else
    echo "install_browser: chromium installed but $CHROMIUM is not there; the browser tests will be skipped."
fi
exit 0
