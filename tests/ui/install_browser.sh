#!/usr/bin/env bash
# Installs Debian's headless chromium and its matching chromedriver for the browser test.
set -euo pipefail
exec bash "$(dirname "$0")/../install_debian.sh" \
    'command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1' chromium chromium-driver
