#!/usr/bin/env bash
# What a user's `pip install` meets: build commtrace's wheel, install it into a fresh venv with
# only its declared dependencies (torch pinned first: COMMTRACE_TORCH, default torch==2.13.0),
# and run every command as a subprocess from outside the repository:
#   commtrace, --help, --version, every subcommand's --help;
#   commtrace run -- torchrun on a sample, then report (text, json), export, diff, synth;
#   report --what-if of a synthetic run over 200,000 rows (held in memory; in the file under a
#   small --memory-limit, with its warning), nothing left in COMMTRACE_TMPDIR;
#   dashboard started, fetched once, stopped (Ctrl-C); python -c "import commtrace; commtrace.load(...)";
#   commtrace accel build (the C++ module: DDP recording, tensor reads; into $WORK/accel-cache via COMMTRACE_CACHE_DIR),
#   accel status, and a traced 2-rank DDP job whose buckets go through that hook (skipped, and
#   said so, only without a C++ compiler).
# The regular suite runs from an editable install with test extras, which hides missing
# dependencies and import-order accidents; this does not. .ci/run calls it after the suite.
#   bash scripts/wheel_smoke.sh            # keeps nothing; WHEEL_SMOKE_DIR=DIR keeps its work in DIR
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=${WHEEL_SMOKE_DIR:-$(mktemp -d /tmp/commtrace-wheel-smoke.XXXXXX)}
mkdir -p "$WORK"
[ -n "${WHEEL_SMOKE_DIR:-}" ] || trap 'rm -rf "$WORK"' EXIT
LOG=$WORK/pip.log
step() { printf '[wheel-smoke] %s\n' "$*"; }
fail() { printf '[wheel-smoke] FAILED: %s\n' "$*" >&2; exit 1; }
quiet() {  # run a pip command, its output to $LOG; shown only when it fails
  if ! "$@" >>"$LOG" 2>&1; then grep -v "is ignored: it is neither" "$LOG" | tail -40 >&2; fail "$*"; fi
}

step "building the wheel from the working tree (tracked and untracked, not ignored, files)"
SRC=$WORK/src
rm -rf "$SRC" "$WORK/dist" && mkdir -p "$SRC"
if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$REPO" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$SRC" 2>/dev/null || true)
else
  (cd "$REPO" && tar --exclude=.venv --exclude=build --exclude=dist -cf - .) | (cd "$SRC" && tar -xf -)
fi
[ -f "$SRC/pyproject.toml" ] || fail "copy of the source tree"
quiet "$PY" -m pip wheel --no-deps -w "$WORK/dist" "$SRC"
WHEEL=$(ls "$WORK"/dist/commtrace-*.whl)
step "wheel: $(basename "$WHEEL")"
if unzip -Z1 "$WHEEL" | grep -v -E '^(commtrace/|commtrace-[^/]*\.dist-info/)' | grep -q .; then
  fail "the wheel installs something outside commtrace/: $(unzip -Z1 "$WHEEL" | grep -v -E '^(commtrace/|commtrace-)' | head -3 | tr '\n' ' ')"
fi

step "fresh venv; ${COMMTRACE_TORCH:-torch==2.13.0} first, then the wheel with its declared dependencies only"
V=$WORK/venv/bin
if [ -n "${WHEEL_SMOKE_REUSE:-}" ] && [ -x "$V/python" ]; then
  # Development shortcut (with WHEEL_SMOKE_DIR): keep the venv's torch, drop commtrace and numpy
  # (which nothing but commtrace's declaration brings in), reinstall the wheel.
  quiet "$V/python" -m pip uninstall -y -q commtrace numpy
else
  rm -rf "$WORK/venv"
  "$PY" -m venv "$WORK/venv"
  quiet "$V/python" -m pip install -q "${COMMTRACE_TORCH:-torch==2.13.0}"
fi
quiet "$V/python" -m pip install -q "$WHEEL"

# From here on: outside the repository, with nothing of it on the path.
cd "$WORK"
rm -rf traces synth64 a.json.gz a.csv
unset PYTHONPATH
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1
CT=$V/commtrace
check() {  # check NAME CMD...: runs CMD, fails with its output when it fails
  local name=$1; shift
  if ! "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"; then
    cat "$WORK/out.txt"; cat "$WORK/err.txt" >&2; fail "$name: $*"
  fi
  if grep -q -E "Traceback|ModuleNotFoundError|Failed to initialize NumPy" "$WORK/err.txt" "$WORK/out.txt"; then
    cat "$WORK/err.txt" >&2; fail "$name printed a traceback or an import failure: $*"
  fi
}
"$V/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('dashboard') is not None)" \
  || fail "a top-level 'dashboard' package is importable from the installed wheel"

step "help and version"
check "bare commtrace" "$CT"
grep -q "Commands:" "$WORK/out.txt" || fail "bare commtrace does not list the commands"
check "--help" "$CT" --help
for c in run report synth dashboard export diff accel; do
  grep -q -E "^  $c " "$WORK/out.txt" || fail "commtrace --help does not list $c"
done
check "--version" "$CT" --version
grep -q "0\.\|[0-9]\.[0-9]" "$WORK/out.txt" || fail "--version prints no version"
for c in run report synth dashboard export diff accel "accel build" "accel status"; do
  # shellcheck disable=SC2086  # "accel build": two words
  check "$c --help" "$CT" $c --help
  grep -q "Examples:" "$WORK/out.txt" || fail "commtrace $c --help has no examples"
done

step "commtrace run -- torchrun (2 ranks, gloo) on samples/ddp_mlp.py"
cp "$REPO/samples/ddp_mlp.py" "$WORK/train.py"
check "run" "$CT" run -o traces/a -- "$V/torchrun" --standalone --nproc-per-node 2 train.py
for r in 0 1; do  # traces/a/<run id>/rank=<r>/part-*.parquet (or without the run id level)
  find traces/a -path "*rank=$r/*" -name "part-*.parquet" | grep -q . || fail "run wrote no trace of rank $r"
done
check "run (second)" "$CT" run -o traces/b -- "$V/torchrun" --standalone --nproc-per-node 2 train.py --steps 6 --straggler-ms 0

step "report, export, diff, synth"
check "report" "$CT" report traces/a
grep -q "all_reduce" "$WORK/out.txt" && grep -q "straggler  rank 1" "$WORK/out.txt" || fail "the report names no all_reduce or not the planted straggler (rank 1)"
check "report json" "$CT" report traces/a --format json
"$V/python" -c "import json,sys; d=json.load(open('$WORK/out.txt')); assert d['world_size']==2, d.get('world_size')" \
  || fail "report --format json"
# root cause and what-if by the wheel's compiled replay (commtrace.analysis._replay): scenarios,
# and the unchanged trace replayed within 2% of the measured run
"$V/python" -c "
import json, commtrace.analysis._replay
w = json.load(open('$WORK/out.txt'))['what_if']
assert w and w['scenarios'], w
assert abs(w['replay_error']) <= 0.02, w['replay_error']
" || fail "report --format json: no what-if from the wheel's compiled replay, or its replay error over 2%"
check "export" "$CT" export traces/a --format perfetto -o a.json.gz
[ -s a.json.gz ] || fail "export wrote nothing"
check "export csv" "$CT" export traces/a --format csv -o a.csv
check "diff" "$CT" diff traces/a traces/b
check "synth" "$CT" synth synth64 --ranks 8 --ops 200 --straggler 3:2ms
check "report synth" "$CT" report synth64
grep -q straggler "$WORK/out.txt" || fail "the synthetic straggler is not reported"

step "report --what-if on a run of over 200,000 rows: held in memory, or in the file when it does not fit"
check "synth (231,112 rows)" "$CT" synth synth_big --ranks 8 --ops 26000 --straggler 3:2ms
mkdir -p "$WORK/ct-tmp"
for lim in "" 64MB; do
  COMMTRACE_TMPDIR=$WORK/ct-tmp check "report --what-if ${lim:+--memory-limit $lim}" \
    "$CT" report synth_big --what-if --format json ${lim:+--memory-limit $lim}
  "$V/python" -c "
import json, sys
d = json.load(open('$WORK/out.txt'))
held = [w for w in d['warnings'] if w.startswith('run held in a database file, not in memory')]
assert d['ops'] == 208000 and d['what_if']['scenarios'], (d['ops'], d['what_if'])
assert [f['rank'] for f in d['findings'] if f['kind'] == 'straggler'] == [3], d['findings']
assert len(held) == (1 if sys.argv[1] else 0), d['warnings']
" "$lim" || fail "report --what-if ${lim:+--memory-limit $lim} on 8 x 26,000 ops"
  [ -z "$(ls -A "$WORK/ct-tmp")" ] || fail "report left files in COMMTRACE_TMPDIR: $(ls -A "$WORK/ct-tmp")"
done

step "library: commtrace.load"
check "load" "$V/python" -c "import commtrace; r = commtrace.load('traces/a'); print(r.world_size, len(r.findings()))"

step "dashboard: start, fetch once, stop"
# From Python, not `cmd &`: a non-interactive shell starts background jobs with SIGINT ignored.
"$V/python" - "$CT" <<'PYEOF' || fail "dashboard"
import signal, socket, subprocess, sys, time, urllib.request
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = subprocess.Popen([sys.argv[1], "dashboard", "traces/a", "--port", str(port), "--no-browser"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
body = None
for _ in range(240):
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=5).read()
        # the first page carries the overview as static HTML (dashboard/prerender.py), styled by
        # the package's own stylesheet: both must come from the installed wheel
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read().decode()
        css = urllib.request.urlopen(f"http://127.0.0.1:{port}/assets/commtrace.css", timeout=30).read().decode()
        break
    except OSError:
        if p.poll() is not None:
            break
        time.sleep(0.5)
p.send_signal(signal.SIGINT)  # Ctrl-C
try:
    out, err = p.communicate(timeout=30)
except subprocess.TimeoutExpired:
    p.kill(); out, err = p.communicate()
print(out, err, sep="\n")
assert body, "the dashboard never answered"
assert 'id="ct-pre"' in page and "straggler" in page, "the first page has no static overview naming the straggler"
assert "commtrace.css" in page and ".ct-pre" in css, "the dashboard's stylesheet is not served from the wheel"
assert f"serving on http://127.0.0.1:{port}/, Ctrl-C to stop" in out, "no 'serving on' line"
for noise in ("Traceback", "GET /", "Serving Flask app", "development server"):
    assert noise not in out + err, f"dashboard printed {noise!r}"
assert p.returncode == 130, f"exit code after Ctrl-C: {p.returncode} (want 130)"
PYEOF

step "accel: the C++ module built from the wheel, and a traced DDP job through it"
T_ACCEL=$SECONDS
# The documented cache directory (commtrace/capture/accel.py: COMMTRACE_CACHE_DIR), inside $WORK.
export COMMTRACE_CACHE_DIR=$WORK/accel-cache
rm -rf "$COMMTRACE_CACHE_DIR" traces/c
if ! { command -v "${CXX:-c++}" || command -v g++; } >/dev/null 2>&1; then
  step "SKIPPED accel build and the C++ hook's DDP job: no C++ compiler (${CXX:-c++} or g++) on PATH"
else
  if ! command -v ninja >/dev/null 2>&1; then  # as `commtrace accel build` tells a user to
    step "no ninja on PATH: pip install ninja into the venv"
    quiet "$V/python" -m pip install -q ninja
  fi
  check "accel status (before)" "$CT" accel status
  grep -q "not built for torch" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "accel status says built before the build"; }
  check "accel build" "$CT" accel build
  cat "$WORK/out.txt"
  grep -q "^C++ module (DDP recording, tensor reads): $COMMTRACE_CACHE_DIR/" "$WORK/out.txt" || fail "accel build names no module in $COMMTRACE_CACHE_DIR"
  check "accel status" "$CT" accel status
  grep -q "^C++ module (DDP recording, tensor reads): built for torch .*: $COMMTRACE_CACHE_DIR/.*\.so$" "$WORK/out.txt" \
    || { cat "$WORK/out.txt"; fail "accel status does not report the hook built in $COMMTRACE_CACHE_DIR"; }
  # A tiny DDP job (3 steps; 2 buckets after DDP's first step, whose bucket holds at most 1 MiB):
  # each rank prints which hook commtrace registered on its DDP model (ddp.py sets
  # _commtrace_hook_kind = "c++" only for the C++ hook) and the C hook's counts (buckets issued
  # by commtrace's hook, handed to Python).
  cat >ddp_cxx.py <<'PYEOF'
import gc, json
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from commtrace.capture import wrappers as W
dist.init_process_group("gloo")
torch.manual_seed(0)
ddp = DDP(nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 10)), bucket_cap_mb=1)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    ddp(torch.randn(8, 32)).sum().backward()
    opt.step()
cf = W._cfast
print("SMOKEDDP " + json.dumps({"rank": dist.get_rank(),
      "hook_kind": ddp.__dict__.get("_commtrace_hook_kind"),
      "n_params": sum(p.numel() for p in ddp.parameters()),
      "counts": list(cf.ddp_counts()) if cf is not None and hasattr(cf, "ddp_counts") else None}),
      flush=True)
del ddp, opt   # free DDP before the group goes (docs/faq.md: torch 2.13 gloo's abort at exit)
gc.collect()
dist.barrier()
dist.destroy_process_group()
PYEOF
  check "run (C++ DDP hook)" "$CT" run -o traces/c -- "$V/torchrun" --standalone --nproc-per-node 2 ddp_cxx.py
  "$V/python" - "$WORK/out.txt" <<'PYEOF' || fail "the DDP job's buckets did not go through the compiled DDP route (recording group or C++ hook)"
import json, sys
import pyarrow.dataset as ds
text = open(sys.argv[1]).read()
dec = json.JSONDecoder()   # torchrun may join two ranks' lines
res = sorted((dec.raw_decode(p)[0] for p in text.split("SMOKEDDP ")[1:]), key=lambda r: r["rank"])
assert [r["rank"] for r in res] == [0, 1], text[-2000:]
# the compiled routes: the recording group handed to the Reducer (the default since session 15)
# or the C++ comm hook (COMMTRACE_DDP_GROUP=0); never the Python path
assert all(r["hook_kind"] in ("group", "c++") for r in res), res
from commtrace.format import runs
rows = ds.dataset(runs.resolve("traces/c"), format="parquet", partitioning="hive").to_table().to_pylist()
for r in res:
    ops = [x for x in rows if x["kind"] == "op" and x["rank"] == r["rank"]
           and x["api"] == "ddp_comm_hook"]
    buckets = {json.loads(x["detail"])["ddp_bucket"] for x in ops}
    # every gradient all-reduced once per step (3 steps), in 2 buckets (DDP's first step: 1)
    assert sum(x["count"] for x in ops) == 3 * r["n_params"] and len(buckets) >= 2, \
        (r, len(ops), buckets)
    assert r["counts"] is None or r["counts"] == [len(ops), 0], (r, len(ops))   # none to Python
    for x in ops:
        assert x["op"] == "all_reduce" and x["async_op"] and x["backend"] == "gloo", x
        assert x["t_end_ns"] is not None and x["t_enqueue_ns"] <= x["t_end_ns"], x
        assert x["completion"] in ("callback", "observed"), x
    print(f"rank {r['rank']}: {r['hook_kind']} route, {len(ops)} all_reduce rows in buckets {sorted(buckets)}, "
          "every one with t_end")
PYEOF
fi
unset COMMTRACE_CACHE_DIR
step "accel steps took $((SECONDS - T_ACCEL)) s"

step "OK: the installed wheel works ($(basename "$WHEEL"))"
