#!/usr/bin/env bash
# Every figure docs/performance.md leads with, in one run, one benchmark at a time (the end-of-
# session "quiet" run). Run it on an otherwise idle machine, after `commtrace accel build`:
#     bash benchmarks/quiet_run.sh [OUTDIR]        # ~20 minutes on 2 cores; logs in OUTDIR
# Each log ends with the load average; read the figures from the logs' summary lines.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/commtrace-quiet}
mkdir -p "$OUT"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
step() {  # step NAME CMD...: run CMD with its output in OUT/NAME.log, the load before and after
  local name=$1; shift
  echo "[quiet] $(date -u +%H:%M:%S) $name: $*  (load $(cut -d' ' -f1-3 /proc/loadavg))"
  { echo "# $*"; echo "# load before: $(cat /proc/loadavg)"; "$@" 2>&1 | grep -v '^USDT:'
    echo "# load after: $(cat /proc/loadavg)"; } >"$OUT/$name.log"
}
step steps_main "$PY" benchmarks/steps.py --workloads ddp fsdp2 pipeline --budget 120
step steps_soak "$PY" benchmarks/steps.py --workloads soak async_loop --budget 40
step steps_ddp_hook env COMMTRACE_DDP_GROUP=0 "$PY" benchmarks/steps.py --workloads ddp --budget 60
step soak "$PY" benchmarks/soak.py --ops 100000
step overhead_ws1 "$PY" benchmarks/overhead.py --world-size 1 --pin one
step overhead_ws2 "$PY" benchmarks/overhead.py --world-size 2 --pin each
step overhead_async "$PY" benchmarks/overhead.py --world-size 1 --pin one --async-op
step rootcause "$PY" benchmarks/rootcause.py --repeat 3
echo "[quiet] $(date -u +%H:%M:%S) done: logs in $OUT"
