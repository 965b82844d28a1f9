#!/usr/bin/env bash
# Quick-start tests: set up .venv, install Debian's chromium for the browser tests (as root), run
# the main suite: every test not marked slow (budget: 8 minutes on 2 idle cores; 12 minutes
# in the 2026-12-03 machine state, docs/performance.md "Main-suite time"). Arguments go to pytest
# and come after the default marker, so `bash scripts/test.sh -m slow` runs the slow stage
# (.ci/run runs both) and `bash scripts/test.sh -m ""` everything.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-env.sh
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[setup] installing Debian's chromium for the browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi
python -m pytest -q -ra -m "not slow" "$@"
