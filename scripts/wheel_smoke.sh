#!/usr/bin/env bash
# What a user's `pip install` meets: build commtrace's wheel, install it into a fresh venv with
# only its declared dependencies (torch pinned first: COMMTRACE_TORCH, default torch==2.13.0),
# and run every command as a subprocess from outside the repository:
#   commtrace, --help, --version, every subcommand's --help;
#   commtrace run -- torchrun on a sample, then report (text, json), export, diff, synth;
#   dashboard started, fetched once, stopped (Ctrl-C); python -c "import commtrace; commtrace.load(...)".
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
for c in run report synth dashboard export diff; do
  grep -q -E "^  $c " "$WORK/out.txt" || fail "commtrace --help does not list $c"
done
check "--version" "$CT" --version
grep -q "0\.\|[0-9]\.[0-9]" "$WORK/out.txt" || fail "--version prints no version"
for c in run report synth dashboard export diff; do
  check "$c --help" "$CT" "$c" --help
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
check "export" "$CT" export traces/a --format perfetto -o a.json.gz
[ -s a.json.gz ] || fail "export wrote nothing"
check "export csv" "$CT" export traces/a --format csv -o a.csv
check "diff" "$CT" diff traces/a traces/b
check "synth" "$CT" synth synth64 --ranks 8 --ops 200 --straggler 3:2ms
check "report synth" "$CT" report synth64
grep -q straggler "$WORK/out.txt" || fail "the synthetic straggler is not reported"

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

step "OK: the installed wheel works ($(basename "$WHEEL"))"
