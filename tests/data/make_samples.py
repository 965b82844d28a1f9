"""Regenerate the small committed sample traces of tests/data/ (deterministic).

    python tests/data/make_samples.py

Each scenario is a directory in the public trace format; tests assert values on them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from commtrace.analysis.synth import synth_run  # noqa: E402
from commtrace.format import schema as S  # noqa: E402

SCENARIOS = {
    "clean": dict(ranks=4, ops=150),
    "straggler": dict(ranks=4, ops=150, straggler=[(1, 5_000_000)]),
    "hang": dict(ranks=4, ops=150, skip=(2, 40)),
    "mismatch": dict(ranks=4, ops=150, mismatch=[(3, 25)]),
    "skew": dict(ranks=4, ops=150, skew=[(1, 50_000_000)]),
    "skew_unrecorded": dict(ranks=4, ops=150, skew=[(1, 50_000_000)], record_offsets=False),
    "hazards": dict(ranks=2, ops=60, hazards=True, init_stall_ns=200_000_000),
}


def make(name: str, **kw) -> str:
    out = os.path.join(HERE, name)
    synth_run(out, seed=1, parts_per_rank=2, command=f"make_samples.py {name}", **kw)
    return out


def required_only() -> None:
    """Another writer: only the REQUIRED columns, no key-value metadata, no manifest."""
    src = os.path.join(HERE, "clean")
    out = os.path.join(HERE, "required_only")
    shutil.rmtree(out, ignore_errors=True)
    for r in range(4):
        d = os.path.join(out, f"rank={r}")
        os.makedirs(d)
        t = pq.read_table(os.path.join(src, f"rank={r}")).select(S.REQUIRED_COLUMNS)
        pq.write_table(t.replace_schema_metadata(None), os.path.join(d, "part-0.parquet"))


def damaged() -> None:
    """Rank 3 missing entirely, a truncated part on rank 1, a stray temp file."""
    src = os.path.join(HERE, "clean")
    out = os.path.join(HERE, "damaged")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    shutil.rmtree(os.path.join(out, "rank=3"))
    parts = sorted(f for f in os.listdir(os.path.join(out, "rank=1")) if f.endswith(".parquet"))
    p = os.path.join(out, "rank=1", parts[-1])
    data = open(p, "rb").read()
    with open(p, "wb") as f:
        f.write(data[: len(data) // 2])
    with open(os.path.join(out, "rank=0", "_tmp-part-x.parquet"), "wb") as f:
        f.write(b"PAR1 half")


def newer_schema() -> None:
    out = os.path.join(HERE, "newer_schema")
    shutil.rmtree(out, ignore_errors=True)
    d = os.path.join(out, "rank=0")
    os.makedirs(d)
    t = pq.read_table(os.path.join(HERE, "clean", "rank=0")).select(S.REQUIRED_COLUMNS).slice(0, 5)
    meta = {S.META_SCHEMA_VERSION: str(S.SCHEMA_VERSION + 1).encode(),
            S.META_JSON: json.dumps({"schema_version": S.SCHEMA_VERSION + 1, "rank": 0}).encode()}
    pq.write_table(t.replace_schema_metadata(meta), os.path.join(d, "part-1-000000.parquet"))


if __name__ == "__main__":
    for name, kw in SCENARIOS.items():
        make(name, **kw)
    required_only()
    damaged()
    newer_schema()
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(HERE) for f in fs)
    print(f"wrote samples to {HERE} ({total / 1e6:.2f} MB)")
