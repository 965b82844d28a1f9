#!/usr/bin/env bash
# Create (or reuse) ./.venv with commtrace (editable) and its dependencies. Sourced by demo.sh
# and test.sh. Prints one line per stage; pip's own output goes to .venv/setup.log and is shown
# only when a stage fails.
#   COMMTRACE_TORCH="torch==X"   torch to install (default torch==2.13.0, from your pip index:
#                                PyPI's Linux default is the CUDA build, several GB)
#   COMMTRACE_TORCH_INDEX=URL    index for torch only, e.g. https://download.pytorch.org/whl/cpu
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
_setup_t0=$SECONDS
_say() { printf '[setup] %s\n' "$*"; }
if [ ! -x .venv/bin/python ]; then
  _say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
SETUP_LOG=.venv/setup.log
: >"$SETUP_LOG"
_quiet() {  # run a pip command with its output in $SETUP_LOG; on failure show its end and stop
  if ! "$@" >>"$SETUP_LOG" 2>&1; then
    printf '[setup] failed: %s\n' "$*" >&2
    grep -v "is ignored: it is neither a file nor a directory" "$SETUP_LOG" | tail -25 >&2
    return 1
  fi
}
python -m pip install -q --upgrade pip >>"$SETUP_LOG" 2>&1 || true
_torch=${COMMTRACE_TORCH:-torch==2.13.0}
if python -c "import sys, importlib.metadata as m; v = m.version('torch'); want = sys.argv[1].partition('==')[2]; sys.exit(0 if want and v.split('+')[0] == want else 1)" "$_torch" 2>/dev/null; then
  _say "$_torch already installed"
else
  _say "installing $_torch${COMMTRACE_TORCH_INDEX:+ from $COMMTRACE_TORCH_INDEX} (the first time: a few minutes)"
  _quiet python -m pip install -q "$_torch" ${COMMTRACE_TORCH_INDEX:+--index-url "$COMMTRACE_TORCH_INDEX"}
fi
# The Spark engine's tests (--engine spark) need a Java runtime: Debian's OpenJDK 17 when none.
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    _sudo=""; [ "$(id -u)" = 0 ] || _sudo="sudo -n"
    _say "installing openjdk-17-jre-headless (java is missing; the Spark engine needs it)"
    if ! { $_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -qq \
          --no-install-recommends openjdk-17-jre-headless; } >>"$SETUP_LOG" 2>&1; then
      _say "could not install openjdk-17-jre-headless (see $SETUP_LOG): --engine spark will not run"
    fi
  else
    _say "java is missing and apt-get is not here: install a Java 17 runtime for --engine spark"
  fi
fi
_say "installing commtrace (editable) and its test dependencies (with the spark extra)"
_quiet python -m pip install -q -e ".[test,spark]${COMMTRACE_EXTRAS:-}"
_say "ready in $((SECONDS - _setup_t0)) s: .venv (in your shell: . .venv/bin/activate)"
