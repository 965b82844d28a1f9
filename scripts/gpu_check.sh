#!/usr/bin/env bash
# Run every GPU check (scripts/gpu_check.py) in one call, on a machine with one CUDA GPU.
#
#   bash scripts/gpu_check.sh [gpu_check.py options]
#
# The GPU machine may lack some of commtrace's dependencies (pyarrow, click) and has no network.
# Packages carried along in ./.gpu_deps (e.g. `pip install --no-deps --target .gpu_deps pyarrow
# click`, built for that machine's Python) are put on PYTHONPATH. PYTHONPATH comes before
# site-packages, so carry only what the machine lacks, never torch or numpy. Without them the
# end-to-end part and `commtrace run` are SKIPPED (not failed); the device-timer checks need
# only torch (and pynvml for the NVML facts).
# When $OUT is set (the device runner's output folder) the report and JSON are written there.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -d .gpu_deps ]; then
  export PYTHONPATH="$PWD:$PWD/.gpu_deps:${PYTHONPATH:-}"
else
  export PYTHONPATH="$PWD:${PYTHONPATH:-}"
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
"$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
if [ -n "${OUT:-}" ]; then
  "$PY" scripts/gpu_check.py --json "$OUT/gpu_check.json" "$@" 2>&1 | tee "$OUT/gpu_check.txt"
  exit "${PIPESTATUS[0]}"
fi
exec "$PY" scripts/gpu_check.py "$@"
