#!/usr/bin/env bash
# Installs Debian packages for the tests when CHECK (a shell test) fails: quiet, and nothing to do the second time.
#   bash tests/install_debian.sh 'CHECK' PACKAGE...
set -euo pipefail

check="$1"
shift
if eval "$check"; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
eval "$check"
