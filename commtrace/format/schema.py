"""Arrow schema and layout of a commtrace run directory (public, versioned contract).

Since schema v2 every job gets a run id (agreed by its ranks at process-group creation) and its
own run directory under the output directory::

    OUT/_manifest.json                 written by `commtrace run`: command, exit code, "runs"
    OUT/<run-id>/                      one run directory per job (the layout below)

Layout of one run::

    RUN/_manifest.json                 command, start time, world size, commtrace version
    RUN/rank=<r>/part-<pid>-<n>.parquet  rows of rank r, one part per flush
    RUN/rank=<r>/_inflight.json        ops still pending at the last flush (rewritten atomically)
    RUN/rank=<r>/stacks-<time>.txt     Python stacks dumped on hang or SIGUSR1

Names starting with ``_`` are skipped by pyarrow's dataset discovery, and ``_inflight.json`` /
``stacks-*.txt`` are not matched by a ``**/*.parquet`` glob, so both
``pyarrow.dataset.dataset(RUN, partitioning="hive")`` and DuckDB's
``read_parquet('RUN/**/*.parquet', hive_partitioning=true)`` read the whole run as one table.

Column meanings follow ``shared/reference/metrics.md``; all ``t_*_ns`` are host wall-clock
nanoseconds since the epoch, on the recording rank's clock (analysis applies the offset).
"""

from __future__ import annotations

import pyarrow as pa

#: Bumped on incompatible change. Readers accept any version <= SCHEMA_VERSION and refuse newer.
#: v2: one run directory per job under the output directory, ``run_id`` in the metadata and the
#: manifests, ``pid``/``host``/``exit`` in ``_inflight.json``, ``_crash-<pid>.txt``. Version-1
#: traces (one run directory, no run id) are read as before.
#: v3: rows of kind ``gap``: collectives torch numbered on a group that no recorded call issued
#: (docs/trace-format.md "Unrecorded collectives"). A v2 trace has none: its gaps are unknown.
SCHEMA_VERSION = 3

MANIFEST_NAME = "_manifest.json"
INFLIGHT_NAME = "_inflight.json"
RANK_DIR_FMT = "rank={rank}"
PART_FMT = "part-{pid}-{index:06d}.parquet"
STACKS_FMT = "stacks-{stamp}.txt"
#: Python stacks written by faulthandler when the rank dies of a fatal signal (SIGABRT, SIGSEGV,
#: ...); empty (and removed at a normal exit) otherwise.
CRASH_FMT = "_crash-{pid}.txt"
CRASH_GLOB = "_crash-*.txt"
#: Written by a waiting rank's watchdog into a rank directory to ask that rank for its stacks.
STACKS_REQUEST_NAME = "_stacks_request.json"

#: Parquet key-value metadata keys.
META_SCHEMA_VERSION = b"commtrace.schema_version"
META_JSON = b"commtrace.meta"

# Row kinds.
KIND_OP = "op"
KIND_SYNC = "sync"
KIND_MARK = "mark"
KIND_HAZARD = "hazard"
#: Collectives a group issued on this rank that no recorded call issued (schema v3).
KIND_GAP = "gap"

#: Columns every trace must carry (the issue's contract); readers need nothing else.
REQUIRED_FIELDS = [
    pa.field("kind", pa.string(), nullable=False),
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("pg", pa.string()),
    pa.field("pg_size", pa.int32()),
    pa.field("seq", pa.int64()),
    pa.field("op", pa.string()),
    pa.field("api", pa.string()),
    pa.field("async_op", pa.bool_()),
    pa.field("backend", pa.string()),
    pa.field("device", pa.string()),
    pa.field("dtype", pa.string()),
    pa.field("count", pa.int64()),
    pa.field("bytes", pa.int64()),
    pa.field("out_bytes", pa.int64()),
    pa.field("peer", pa.int32()),
    pa.field("root", pa.int32()),
    pa.field("t_enqueue_ns", pa.int64()),
    pa.field("t_return_ns", pa.int64()),
    pa.field("t_start_ns", pa.int64()),
    pa.field("t_end_ns", pa.int64()),
    pa.field("t_wait_ns", pa.int64()),
    pa.field("t_wait_end_ns", pa.int64()),
    pa.field("step", pa.int64()),
    pa.field("site", pa.string()),
    pa.field("error", pa.string()),
]

#: Optional extension columns (schema v1). Readers fill them with nulls when absent.
EXTRA_FIELDS = [
    # Per-rank unique id of the row's op; sync/hazard rows refer to ops by it.
    pa.field("op_id", pa.int64()),
    # For hazard rows: the pending op the hazard concerns.
    pa.field("ref_op_id", pa.int64()),
    # For sync rows: number and ids of async ops in flight at the call.
    pa.field("inflight", pa.int32()),
    pa.field("inflight_ids", pa.list_(pa.int64())),
    # First op on this communicator (collective) or peer pair (p2p): carries lazy init.
    pa.field("first_on_pg", pa.bool_()),
    # GPU: time the caller's stream sat behind the comm stream at wait() (exposed, ns).
    pa.field("stream_wait_ns", pa.int64()),
    # Thread that issued the call (threading.get_ident()).
    pa.field("thread", pa.int64()),
    # Free-form detail (hazard type, DDP bucket index, ...), JSON or plain text.
    pa.field("detail", pa.string()),
    # How t_end_ns was obtained (docs/trace-format.md, "Completion"): notified at the end
    # ("callback", "device", "hook") or an upper bound seen by commtrace ("observed": already
    # complete when first looked at; "wait": wait() returned; "return": a blocking call returned).
    pa.field("completion", pa.string()),
    # The process group's own sequence number of the op, where torch exposes it (NCCL WorkInfo
    # merge, docs/trace-format.md); null elsewhere.
    pa.field("torch_seq", pa.int64()),
]

SCHEMA = pa.schema(REQUIRED_FIELDS + EXTRA_FIELDS)
COLUMNS: list[str] = SCHEMA.names
REQUIRED_COLUMNS: list[str] = [f.name for f in REQUIRED_FIELDS]
TIME_COLUMNS = ["t_enqueue_ns", "t_return_ns", "t_start_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns"]

#: Keys of the per-file JSON metadata (META_JSON). All optional for readers.
META_KEYS = (
    "schema_version", "rank", "world_size", "host", "pid", "torch_version", "commtrace_version",
    "backend", "clock_offset_ns", "clock_offset_method", "clock_rtt_ns", "dropped_rows",
    "pg_ranks",  # {pg name: [global ranks]}
    "nvml", "nccl_version", "nccl_env", "graph_captured_ops",
    "flush_interval_s", "clock_skew_injected_ns", "capture_path",  # "c" or "python"
    "run_id",  # v2: the job's run id, the same on every rank
    "simulated",  # true: torch's fake backend, the other ranks of the world are not processes
)
