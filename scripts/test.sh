#!/usr/bin/env bash
# Quick-start tests: set up, install Debian's chromium for the browser tests, run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-env.sh
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi
python -m pytest -q -ra "$@"
