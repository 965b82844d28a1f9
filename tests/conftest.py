"""Shared fixtures and helpers for the test suite.

Multi-process helpers run real commands in subprocesses, always with a timeout, on 127.0.0.1
only, with ports chosen free (torchrun --standalone picks its own):

- :func:`torchrun_cmd` builds ``python -m torch.distributed.run --standalone ...``;
- :func:`launch_cmd` builds the same job through tests/launch_ranks.py (no torch import in the
  launcher), for jobs that are not about the launcher;
- :func:`run_traced` runs ``commtrace run -o DIR [opts] -- <cmd>``;
- :func:`run_plain` runs a command without commtrace (scripts that call commtrace.enable());
- :func:`load_rows` reads a run directory as a list of dicts (pyarrow dataset, hive ranks).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "samples")
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now (held together while chosen; a test
    that needs several must not use port + 1, which another job on the machine may hold)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def clean_env(extra: dict | None = None) -> dict:
    """The test process's environment without COMMTRACE_* settings, with the repo importable,
    one OpenMP thread per process (2-core machines) and unbuffered output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMTRACE_")}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["MASTER_ADDR"] = "127.0.0.1"
    if extra:
        env.update(extra)
    return env


def torchrun_cmd(script: str, *args, nproc: int = 2) -> list[str]:
    """``torchrun --standalone --nproc-per-node N script args`` through this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), script, *map(str, args)]


def launch_cmd(script: str, *args, nproc: int = 2) -> list[str]:
    """Like :func:`torchrun_cmd`, through tests/launch_ranks.py: the ranks started with
    torchrun's environment by a launcher that does not import torch (a third less start-up
    CPU for a 2-rank job). For jobs that are not about the launcher; each area keeps its
    end-to-end tests through ``commtrace run -- torchrun``."""
    return [sys.executable, os.path.join(ROOT, "tests", "launch_ranks.py"), "--nproc-per-node",
            str(nproc), script, *map(str, args)]


def run_plain(cmd: list[str], env: dict | None = None, timeout: float = 120,
              check: bool = True, before_retry=None) -> subprocess.CompletedProcess:
    """Run `cmd` (no commtrace run) and return the completed process.

    Torch 2.13's gloo jobs sometimes abort at interpreter exit, after all their work, with
    "terminate called without an active exception" (SIGABRT): tests/scripts/funcol_all.py did
    so in 2 of 8 plain runs without commtrace anywhere (2026-12-02). Such a run is repeated
    once (after `before_retry()`, which clears what the first attempt wrote); an abort that
    comes back, or any other failure, still fails the test."""
    p = subprocess.run(cmd, env=clean_env(env), capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    if p.returncode != 0 and "terminate called without an active exception" in p.stderr:
        sys.stderr.write("run_plain: torch aborted at exit (terminate without an active "
                         "exception); running the job once more\n")
        if before_retry is not None:
            before_retry()
        p = subprocess.run(cmd, env=clean_env(env), capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT)
    if check:
        assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


def run_both_paths(code: str, tmp_path):
    """Run the world-size-1 script `code` (argv: its output directory, a port) on the C paths
    and on the pure Python path (COMMTRACE_PURE_PYTHON=0, then 1); [(mode, output dir,
    stdout)] once each has exited cleanly."""
    ports = free_ports(2)
    done = []
    for i, mode in enumerate(("0", "1")):
        d = tmp_path / f"pure{mode}"
        p = subprocess.run([sys.executable, "-c", code, str(d), str(ports[i])],
                           env=clean_env({"COMMTRACE_PURE_PYTHON": mode}), capture_output=True,
                           text=True, timeout=300)   # 120 s ran out at load 15 (session 15)
        assert p.returncode == 0, p.stderr[-2000:]
        done.append((mode, d, p.stdout))
    return done


def run_job_results(tmp_path_factory, name: str, script: str) -> tuple:
    """Run `script` (one of tests/scripts, argument: its run directory) on 2 gloo ranks (the
    light launcher: the writer's tests are not about it); (the run directory, {rank: its
    result-<rank>.json})."""
    import json

    out = tmp_path_factory.mktemp(name) / "run"
    run_plain(launch_cmd(script, out), timeout=240)
    res = {}
    for r in (0, 1):
        with open(out / f"result-{r}.json") as f:
            res[r] = json.load(f)
    return out, res


def marked_json(stdout: str, marker: str) -> list[dict]:
    """The JSON objects a multi-rank job printed after `marker` (one per rank), ordered by their
    "rank". torchrun may join two ranks' lines ("...}MARK {..."), so each object is decoded
    where it starts."""
    import json

    dec = json.JSONDecoder()
    return sorted((dec.raw_decode(part)[0] for part in stdout.split(marker)[1:]),
                  key=lambda r: r["rank"])


def run_traced(out: str, cmd: list[str], opts: tuple = (), env: dict | None = None,
               timeout: float = 150, check: bool = True) -> subprocess.CompletedProcess:
    """``commtrace run -o OUT [opts] -- cmd``; returns the completed process. A job repeated
    by run_plain (torch's abort at exit) starts from an empty OUT: the first attempt's run
    would otherwise sit beside the second's, and a test reading every Parquet file below OUT
    would see each row twice (test_accel_meta did, once in a loaded suite)."""
    import shutil

    full = [sys.executable, "-m", "commtrace", "run", "-o", str(out), *opts, "--", *cmd]
    return run_plain(full, env=env, timeout=timeout, check=check,
                     before_retry=lambda: shutil.rmtree(out, ignore_errors=True))


def run_until_hung(out: str, script: str, *args, marker: str = "rank 1 done issuing",
                   wait_s: float = 90, settle_s: float = 2.0) -> None:
    """``commtrace run`` a job that hangs on purpose: wait until it prints `marker` (or `wait_s`
    passes), leave it `settle_s` for a few flushes while it hangs, then SIGTERM it."""
    import signal
    import time

    cmd = ["timeout", "-s", "TERM", str(int(wait_s * 2)), sys.executable, "-m", "commtrace", "run",
           "-o", str(out), "--flush-interval", "0.3", "--", *torchrun_cmd(script, *args)]
    p = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, cwd=ROOT)
    try:
        t0 = time.time()
        for line in p.stdout:
            if marker in line or time.time() - t0 > wait_s:
                break
        time.sleep(settle_s)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=wait_s)
    finally:
        if p.poll() is None:
            p.kill()


def run_path(out) -> str:
    """The one run directory under `out` (``commtrace run -o OUT`` writes OUT/<run-id>/), or
    `out` itself when it is a run directory."""
    from commtrace.format import runs

    return runs.resolve(str(out))


def load_rows(run_dir: str) -> list[dict]:
    """All rows of a run directory (every rank), as dicts; `run_dir` may be the output
    directory of a single run."""
    import pyarrow.dataset as ds

    return ds.dataset(run_path(run_dir), format="parquet", partitioning="hive").to_table().to_pylist()


def rank_meta(run_dir: str) -> dict[int, dict]:
    """rank -> the JSON metadata of its last part."""
    import glob
    import json

    import pyarrow.parquet as pq

    out = {}
    for f in sorted(glob.glob(os.path.join(run_path(run_dir), "rank=*", "*.parquet"))):
        m = json.loads(pq.read_schema(f).metadata[b"commtrace.meta"])
        out[int(m["rank"])] = m
    return out


@pytest.fixture
def port() -> int:
    return free_port()


#: Debian's chromium, which the browser tests drive through Playwright (Playwright's own browser
#: download does not work here).
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """One headless chromium per test module (the browser tests)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def pytest_collection_modifyitems(config, items):
    """Tests using `accel_cache` get a 20-minute timeout: the first of them in a session pays
    the fixture's build of the C++ module (setup counts toward pytest-timeout's 300 s), which
    took over 300 s on the 2-core machine at load 8 (2026-12-03) and about 1-2 minutes idle."""
    for item in items:
        if "accel_cache" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(1200))


@pytest.fixture(scope="session")
def accel_cache(request):
    """The module of ``commtrace accel build`` (the C++ DDP hook and the C fast path's reads
    through torch's C++ API) built for this torch, as the command builds it, into a cache
    directory kept between test sessions (pytest's cache: a rebuild only when torch, Python,
    commtrace's version or the sources change). Skipped only without a C++ compiler."""
    import shutil
    if not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")):
        pytest.skip("no C++ compiler (c++ / g++ / $CXX): the accel module cannot be built")
    d = str(request.config.cache.mkdir("commtrace-accel"))
    p = subprocess.run([sys.executable, "-m", "commtrace", "accel", "build"],
                       env=clean_env({"COMMTRACE_CACHE_DIR": d}), capture_output=True,
                       text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return d
