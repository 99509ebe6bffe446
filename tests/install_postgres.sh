#!/usr/bin/env bash
# Installs Debian's PostgreSQL server binaries for the postgres tests, which start a throwaway server
# (initdb + pg_ctl, tests/pg_server.py) when none answers at AGENT_RL_TEST_PG.
# Idempotent and quiet: does nothing when the binaries are already present.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
