#!/usr/bin/env bash
# Create (or reuse) ./.venv with commtrace and its dependencies. Sourced by demo.sh and test.sh.
# torch is pinned to the CPU build that lies on this machine's disk (a loose pin would download
# a multi-GB CUDA build). Override with COMMTRACE_TORCH="torch==X" where needed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -m pip install -q "${COMMTRACE_TORCH:-torch==2.13.0}"
python -m pip install -q -e ".[test]${COMMTRACE_EXTRAS:-}"
