#!/usr/bin/env bash
# Quick-start demo: set up .venv, trace a 2-rank CPU (gloo) DDP job whose last rank is a planted
# straggler (samples/ddp_mlp.py sleeps 40 ms on it before every step), print the report, which
# finds it, and serve the dashboard on http://127.0.0.1:8050 (Ctrl-C to stop). Arguments go to
# `commtrace dashboard` (e.g. --port 8051 --no-browser). The trace goes to traces/demo (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-env.sh
out=traces/demo
rm -rf "$out"
echo "[demo] tracing: commtrace run -o $out -- torchrun --standalone --nproc-per-node 2 samples/ddp_mlp.py"
commtrace run -o "$out" -- torchrun --standalone --nproc-per-node 2 samples/ddp_mlp.py
echo "[demo] the report: commtrace report $out"
commtrace report "$out"
echo "[demo] the dashboard: commtrace dashboard $out  (its Overview names the straggler)"
exec commtrace dashboard "$out" "$@"
