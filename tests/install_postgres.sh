#!/usr/bin/env bash
# Installs Debian's PostgreSQL server binaries for the postgres tests, which start a throwaway server
# (initdb + pg_ctl, tests/pg_server.py) when none answers at AGENT_RL_TEST_PG.
set -euo pipefail
exec bash "$(dirname "$0")/install_debian.sh" 'compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null' postgresql
