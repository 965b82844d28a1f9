"""A SIGTERM that lands while the rank writes (between a part's write and its rename, or during
the exit flush) is held until the write is done, then does what it would have done: the part
is complete and renamed, the snapshot says final, and the exit status is still the signal's."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import os, signal, sys
    from commtrace.capture import recorder as R
    from commtrace.config import Config
    from commtrace.format import writer as W

    out, when = sys.argv[1], sys.argv[2]
    rec = R.Recorder(Config(output=out), rank=0, world_size=1, start_thread=False)
    rec.install_exit_handlers()
    real = W.write_part

    def write_part(*a, **k):
        # The signal arrives after the part's bytes are written and before its rename.
        path = real(*a, **k) if when == "after" else None
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):   # let the handler run here, inside the write
            pass
        return real(*a, **k) if when == "before" else path

    W.write_part = write_part
    for i in range(5):
        rec.emit(kind="mark", step=i)
    if sys.argv[3] == "close":
        rec.close()          # the exit flush
    else:
        rec.flush()          # a periodic flush of the main thread
    print("after", flush=True)  # reached only when the signal was absorbed (it must not be)
''')


def _run(tmp_path, when, how):
    out = tmp_path / f"{when}-{how}"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(out), when, how],
                       capture_output=True, text=True, timeout=60)
    return out, p


def test_sigterm_during_the_exit_flush_is_delivered_after_it(tmp_path):
    import pyarrow.dataset as ds

    for when in ("before", "after"):
        out, p = _run(tmp_path, when, "close")
        assert p.returncode == -signal.SIGTERM, (when, p.returncode, p.stderr[-2000:])
        assert "after" not in p.stdout
        assert not glob.glob(str(out / "rank=0" / "*.partial")), when
        assert ds.dataset(str(out), partitioning="hive").count_rows() == 5, when
        snap = json.loads((out / "rank=0" / "_inflight.json").read_text())
        assert snap["final"] is True, when


def test_sigterm_during_a_periodic_flush_ends_the_process_with_everything_written(tmp_path):
    import pyarrow.dataset as ds

    out, p = _run(tmp_path, "after", "flush")
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stderr[-2000:])
    assert "after" not in p.stdout
    assert not glob.glob(str(out / "rank=0" / "*.partial"))
    # The periodic part is complete, and the SIGTERM (default action) then closed the
    # recorder: every row is there once, and the snapshot is the final one.
    assert ds.dataset(str(out), partitioning="hive").count_rows() == 5
    assert json.loads((out / "rank=0" / "_inflight.json").read_text())["final"] is True
    assert os.path.isdir(out / "rank=0")


def test_a_part_without_its_footer_is_not_renamed_into_the_run(tmp_path, monkeypatch):
    """A write that returns without an error but leaves a truncated file (seen on a full disk)
    raises, and nothing is left behind: the recorder counts those rows as dropped."""
    import pyarrow as pa

    from commtrace.format import writer as W

    real = W.write_parquet

    def truncated(table, path, compression="zstd"):
        real(table, path, compression)
        with open(path, "r+b") as f:
            f.truncate(max(0, os.path.getsize(path) - 100))

    monkeypatch.setattr(W, "write_parquet", truncated)
    t = pa.table({"x": list(range(1000))})
    try:
        W.write_part(str(tmp_path), 0, t, {"rank": 0})
    except OSError as e:
        assert "incomplete Parquet part" in str(e)
    else:
        raise AssertionError("a truncated part was accepted")
    assert os.listdir(tmp_path / "rank=0") == []
    monkeypatch.setattr(W, "write_parquet", real)
    p = W.write_part(str(tmp_path), 0, t, {"rank": 0})
    assert os.listdir(tmp_path / "rank=0") == [os.path.basename(p)]
