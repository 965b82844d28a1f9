#!/usr/bin/env bash
# Quick-start demo: set up, trace a 2-rank CPU (gloo) DDP job, print its report, serve the
# dashboard on http://127.0.0.1:8050 (Ctrl-C to stop).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-env.sh
out=commtrace-traces/demo
rm -rf "$out"
commtrace run -o "$out" -- torchrun --nproc-per-node 2 samples/ddp_mlp.py
if commtrace --help | grep -q report; then commtrace report "$out"; fi
if commtrace --help | grep -q dashboard; then exec commtrace dashboard "$out" "$@"; fi
