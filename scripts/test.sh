#!/usr/bin/env bash
# Quick-start tests: set up .venv, install Debian's chromium for the browser tests (as root), run
# the main suite: every test not marked slow, on two pytest-xdist workers (budget: 8 minutes on
# 2 idle cores: it takes 12.7-12.9 minutes of CPU, docs/performance.md "Session 20 / Main-suite
# time"; serial, 10-12 minutes idle in the 2026-12-03 machine state). Arguments go to pytest
# and come after the default marker, so `bash scripts/test.sh -m slow` runs the slow stage
# (.ci/run runs both, the slow stage in one process) and `bash scripts/test.sh -m ""` everything.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-env.sh
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[setup] installing Debian's chromium for the browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi
# The C++ module of `commtrace accel build` (DDP's comm hook), built once per torch install as a
# user builds it, into the directory the tests' `accel_cache` fixture reads (pytest's cache): a
# build step, like pip's of the C fast path, so the suite's own time does not include it (2-3
# minutes on a fresh clone here). Without a C++ compiler the fixture skips the tests needing it.
if command -v "${CXX:-c++}" >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; then
  _t=$SECONDS
  if COMMTRACE_CACHE_DIR="$PWD/.pytest_cache/d/commtrace-accel" python -m commtrace accel build \
      >.venv/accel-build.log 2>&1; then
    echo "[setup] commtrace accel build: ready ($((SECONDS - _t)) s)"
  else
    echo "warning: commtrace accel build failed (.venv/accel-build.log); the tests using it will build it again" >&2
  fi
fi
# Two pytest-xdist workers, each test file on one worker (module fixtures run once: --dist
# loadfile); COMMTRACE_TEST_WORKERS=N for N workers, 0 for one process (.ci/run's slow stage).
par=()
if [ "${COMMTRACE_TEST_WORKERS:-2}" != 0 ] && python -c "import xdist" 2>/dev/null; then
  par=(-n "${COMMTRACE_TEST_WORKERS:-2}" --dist loadfile)
fi
python -m pytest -q -ra -m "not slow" "${par[@]}" "$@"
