"""The op table: one source of truth for canonical op names, their wait-state pattern and the
nccl-tests bandwidth factors (``shared/reference/metrics.md``, "Communication time and bandwidth").

The capture side's per-API table (which torch function maps to which canonical op and how its
sizes, peer and root are read) lives in :mod:`commtrace.capture.api_table` and refers to the
names defined here. Import-light: no torch, no pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass

# Wait-state patterns (metrics.md, "Wait states").
NXN = "nxn"                  # all_reduce, all_gather, reduce_scatter, all_to_all, barrier
LATE_BROADCAST = "late_broadcast"  # broadcast, scatter: non-roots wait for the root
EARLY_REDUCE = "early_reduce"      # reduce, gather: the root waits for the others
P2P = "p2p"                  # send / recv: late sender, late receiver


@dataclass(frozen=True)
class OpInfo:
    """Facts about one canonical op."""

    name: str
    pattern: str
    #: How S (bytes moved, metrics.md) is derived from one rank's row:
    #: "bytes" = count x dtype size of the input; "out" = out_bytes (per-rank output x n for
    #: reduce_scatter is the input size); "bytes_x_n" = input bytes x group size.
    size_rule: str
    #: busbw factor kind: "allreduce" = 2(n-1)/n, "nm1_n" = (n-1)/n, "one" = 1.
    factor: str
    collective: bool = True


OPS: dict[str, OpInfo] = {
    o.name: o
    for o in (
        OpInfo("all_reduce", NXN, "bytes", "allreduce"),
        # reduce_scatter: S = per-rank output x n == this rank's input bytes.
        OpInfo("reduce_scatter", NXN, "bytes", "nm1_n"),
        # all_gather: S = per-rank input x n.
        OpInfo("all_gather", NXN, "bytes_x_n", "nm1_n"),
        # all_to_all: S = count x n x dtype size, count being the per-peer chunk; the row's
        # `bytes` already holds this rank's whole input (= chunk x n).
        OpInfo("all_to_all", NXN, "bytes", "nm1_n"),
        OpInfo("barrier", NXN, "bytes", "one"),
        OpInfo("broadcast", LATE_BROADCAST, "bytes", "one"),
        OpInfo("scatter", LATE_BROADCAST, "bytes_x_n", "nm1_n"),
        OpInfo("reduce", EARLY_REDUCE, "bytes", "one"),
        OpInfo("gather", EARLY_REDUCE, "bytes_x_n", "nm1_n"),
        OpInfo("send", P2P, "bytes", "one", collective=False),
        OpInfo("recv", P2P, "bytes", "one", collective=False),
    )
}

CANONICAL_OPS: tuple[str, ...] = tuple(OPS)
COLLECTIVE_OPS: tuple[str, ...] = tuple(n for n, o in OPS.items() if o.collective)
P2P_OPS: tuple[str, ...] = ("send", "recv")


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor F for `op` in a group of `n` ranks (metrics.md)."""
    info = OPS.get(op)
    if info is None or n <= 0:
        return 1.0
    if info.factor == "allreduce":
        return 2.0 * (n - 1) / n
    if info.factor == "nm1_n":
        return (n - 1) / n
    return 1.0


def size_bytes(op: str, bytes_: int, n: int) -> int:
    """S, the bytes a collective moves, from one rank's input `bytes_` (metrics.md)."""
    info = OPS.get(op)
    if info is not None and info.size_rule == "bytes_x_n":
        return int(bytes_) * int(n)
    return int(bytes_)

#: A fixed colour per canonical op, the same in every run and every view (the dashboard's
#: timeline and bandwidth plot); ops outside the table take :data:`OTHER_OP_COLOR`.
OP_COLORS: dict[str, str] = {
    "all_reduce": "#1f77b4", "reduce_scatter": "#ff7f0e", "all_gather": "#2ca02c", "all_to_all": "#9467bd",
    "barrier": "#7f7f7f", "broadcast": "#8c564b", "scatter": "#e377c2", "reduce": "#17becf",
    "gather": "#bcbd22", "send": "#393b79", "recv": "#637939",
}
OTHER_OP_COLOR = "#8c6d31"
