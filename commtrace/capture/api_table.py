"""The per-API table: which torch.distributed function maps to which canonical op
(:mod:`commtrace.ops`), and how its sizes, peer and root are read.

Size conventions (``docs/trace-format.md``):

- ``count`` / ``bytes``: this rank's input elements / bytes. For ``gather``: this rank's input
  chunk; ``scatter``: this rank's output chunk; ``all_gather``: this rank's input;
  ``reduce_scatter``: this rank's full input; ``all_to_all``: this rank's whole input;
  ``send`` / ``recv``: the tensor sent or received.
- ``out_bytes``: this rank's output bytes (0 for a non-root ``gather``, the buffer itself for
  in-place ops).
- ``peer`` / ``root``: global ranks, whichever of ``dst`` / ``src`` (global) or ``group_dst`` /
  ``group_src`` (group rank) the caller passed.
- Object collectives move pickled bytes through inner tensor collectives; their ``bytes`` and
  ``out_bytes`` are the sums over those inner calls on this rank (size exchange included).

Parameter positions are read from the installed torch's signatures at install time, so the
table survives argument drift between releases (``group_dst`` / ``group_src`` appeared in 2.6).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from .. import ops as _ops


@dataclass(frozen=True)
class ApiSpec:
    """How to read one torch.distributed function."""

    op: str                       # canonical op (commtrace.ops)
    ins: str | None = None        # parameter holding this rank's input ("*" suffix: a list)
    outs: str | None = None       # parameter holding this rank's output ("*": list, "**": list of lists)
    peer: tuple = ()              # (global-rank param, group-rank param) for send/recv
    root: tuple = ()              # (global-rank param, group-rank param) for rooted collectives
    group: str = "group"
    async_param: str | None = "async_op"
    always_async: bool = False
    object: bool = False          # object collective: sizes come from inner tensor calls
    positional: tuple = ()        # parameter names, for C++ functions without a signature
    sizes: str | None = None      # a dedicated size rule (wrappers._SIZE_RULES)

    @property
    def p2p(self) -> bool:
        return self.op in _ops.P2P_OPS


_AG = dict(op="all_gather", ins="input_tensor", outs="output_tensor")
_RS = dict(op="reduce_scatter", ins="input", outs="output")

#: torch.distributed function name -> spec. Every communicating function of the installed torch
#: must be here or in SKIPPED (tests/test_capture_coverage.py enforces it).
API_TABLE: dict[str, ApiSpec] = {
    "all_reduce": ApiSpec("all_reduce", ins="tensor", outs="tensor"),
    "all_reduce_coalesced": ApiSpec("all_reduce", ins="tensors*", outs="tensors*"),
    "broadcast": ApiSpec("broadcast", ins="tensor", outs="tensor", root=("src", "group_src")),
    "reduce": ApiSpec("reduce", ins="tensor", outs="tensor", root=("dst", "group_dst")),
    "all_gather": ApiSpec("all_gather", ins="tensor", outs="tensor_list*"),
    "all_gather_into_tensor": ApiSpec(**_AG),
    "all_gather_single": ApiSpec(**_AG),
    "_all_gather_base": ApiSpec(**_AG),
    "all_gather_coalesced": ApiSpec("all_gather", ins="input_tensor_list*",
                                    outs="output_tensor_lists**"),
    "gather": ApiSpec("gather", ins="tensor", outs="gather_list*", root=("dst", "group_dst")),
    "scatter": ApiSpec("scatter", ins="tensor", outs="tensor", root=("src", "group_src")),
    "reduce_scatter": ApiSpec("reduce_scatter", ins="input_list*", outs="output"),
    "reduce_scatter_tensor": ApiSpec(**_RS),
    "reduce_scatter_single": ApiSpec(**_RS),
    "_reduce_scatter_base": ApiSpec(**_RS),
    "all_to_all": ApiSpec("all_to_all", ins="input_tensor_list*", outs="output_tensor_list*"),
    "all_to_all_single": ApiSpec("all_to_all", ins="input", outs="output"),
    "barrier": ApiSpec("barrier"),
    "monitored_barrier": ApiSpec("barrier", async_param=None),
    "send": ApiSpec("send", ins="tensor", peer=("dst", "group_dst"), async_param=None),
    "recv": ApiSpec("recv", ins="tensor", outs="tensor", peer=("src", "group_src"),
                    async_param=None),
    "isend": ApiSpec("send", ins="tensor", peer=("dst", "group_dst"), async_param=None,
                     always_async=True),
    "irecv": ApiSpec("recv", ins="tensor", outs="tensor", peer=("src", "group_src"),
                     async_param=None, always_async=True),
    # Object collectives: pickled objects through inner tensor collectives.
    "broadcast_object_list": ApiSpec("broadcast", root=("src", "group_src"), async_param=None,
                                     object=True),
    "all_gather_object": ApiSpec("all_gather", async_param=None, object=True),
    "gather_object": ApiSpec("gather", root=("dst", "group_dst"), async_param=None, object=True),
    "scatter_object_list": ApiSpec("scatter", root=("src", "group_src"), async_param=None,
                                   object=True),
    "send_object_list": ApiSpec("send", peer=("dst", "group_dst"), async_param=None, object=True),
    "recv_object_list": ApiSpec("recv", peer=("src", "group_src"), async_param=None, object=True),
    # Private C++ entry points that libraries call through Python (DDP's construction-time
    # parameter broadcast and shape check). `src` is a rank of `process_group`.
    "_broadcast_coalesced": ApiSpec("broadcast", ins="tensors*", outs="tensors*",
                                    root=("", "src"), group="process_group", async_param=None,
                                    positional=("process_group", "tensors", "buffer_size", "src")),
    # Its sizes are those of its all_gather: one int64 per rank (the parameter count). The
    # same C++ call then broadcasts 2 int64 per parameter dimension (shapes, strides) from
    # rank 0, not a row of its own (docs/trace-format.md).
    "_verify_params_across_processes": ApiSpec("all_gather", group="process_group",
                                               async_param=None,
                                               positional=("process_group", "params", "logger"),
                                               sizes="ddp_verify_params"),
}

#: Functions wrapped by dedicated code rather than through API_TABLE.
SPECIAL = {
    "batch_isend_irecv": "one row per send/recv of the batch (api='batch_isend_irecv'), through "
                         "the isend/irecv wrappers; P2POps built before tracing are re-pointed",
    "_coalescing_manager": "rows of the ops issued inside; completion from the coalesced Work",
}

#: torch.distributed functions deliberately not wrapped, with the reason. Anything callable in
#: torch.distributed that is in neither API_TABLE, SPECIAL nor here fails the coverage test.
SKIPPED: dict[str, str] = {
    # group management: rendezvous / store traffic, not ops on a group
    "init_process_group": "group creation (commtrace hooks it to start tracing, no op row)",
    "destroy_process_group": "group teardown; no collective (wrapped only to drop commtrace's "
                             "cached groups, no row)",
    "new_group": "group creation through the store; any barrier it issues is recorded as barrier",
    "new_subgroups": "group creation (calls new_group)",
    "new_subgroups_by_enumeration": "group creation (calls new_group)",
    "split_group": "communicator split at creation time; not a data op on a user group",
    "shrink_group": "fault-tolerance group rebuild; not a data op",
    "init_device_mesh": "creates groups (new_group / split_group)",
    "rendezvous": "store rendezvous, not a process-group op",
    "register_rendezvous_handler": "registry of rendezvous handlers; no communication",
    "_create_store_from_options": "creates a store; no process-group op",
    "_test_python_store": "store self-test; no process-group op",
    "_create_process_group_wrapper": "debug wrapper construction (its checks are C++ side)",
    "breakpoint": "calls barrier(), recorded there",
    "record_comm": "sets the profiler name of later collectives; no communication itself",
    "_time_estimator": "context manager that estimates collective time without running them",
    "_register_comm_hook": "DDP hook registration (commtrace's DDP module hooks DDP itself)",
    "_register_builtin_comm_hook": "DDP builtin hook registration (handled by the DDP module)",
    "_make_distributed_pdb": "debugger helper; no communication",
    "_make_nccl_premul_sum": "builds a ReduceOp; no communication",
    "_compute_bucket_assignment_by_size": "DDP bucket planning; no communication",
    "_rank_not_in_group": "membership query",
    "_get_process_group_name": "name lookup",
    "_is_spmd_types_available": "feature query",
}

#: Name patterns of query/config functions that never communicate (prefix match).
NON_COMMUNICATING_PREFIXES = ("get_", "is_", "set_", "supports_", "GroupName")

#: Public classes of torch.distributed, with the reason commtrace does not wrap them.
CLASS_REASONS: dict[str, str] = {
    "ProcessGroup": "its methods (pg.allreduce(...)) are the backend's C++ entry points that "
                    "the wrapped functions call; not wrapped: see PROCESS_GROUP_METHODS",
    "ProcessGroupGloo": "a ProcessGroup backend (see ProcessGroup)",
    "ProcessGroupNCCL": "a ProcessGroup backend (see ProcessGroup)",
    "Work": "handle of an issued op; Work.wait is patched for t_wait_ns / t_wait_end_ns",
    "P2POp": "describes a send/recv; it runs (and is recorded) in batch_isend_irecv",
    "Backend": "backend names and registry; no communication",
    "BackendConfig": "backend configuration; no communication",
    "BuiltinCommHookType": "enum of DDP's C++ hooks (commtrace's DDP module handles them)",
    "DebugLevel": "enum of debug levels",
    "ReduceOp": "enum of reduction operators",
    "GroupMember": "constants (WORLD, NON_GROUP_MEMBER)",
    "group": "namespace holding the WORLD group",
    "DeviceMesh": "creates groups (new_group / split_group); its collectives are the functional "
                  "ones, wrapped",
    "GradBucket": "DDP bucket handed to comm hooks; no communication",
    "Logger": "DDP logging; no communication",
    "Reducer": "DDP's C++ reducer: its gradient all-reduces bypass Python; recorded through "
               "the DDP comm hook (commtrace/capture/ddp.py)",
    "AsyncCollectiveTensor": "result of a functional collective; its wait is the wrapped "
                             "wait_tensor",
}

#: ProcessGroup's public methods, none wrapped. They are the backend's C++ API that every
#: wrapped torch.distributed function ends in: wrapping them would record each op twice (or
#: need a depth check on every op), and the C++ callers (DDP's reducer, compiled graphs) do not
#: go through the Python bindings anyway. A direct ``pg.allreduce([t])`` from Python (some
#: libraries and PyTorch's own tests) is therefore not recorded (docs/faq.md). The coverage
#: test fails when torch adds a method, so that this stays a decision.
PROCESS_GROUP_METHODS = frozenset({
    "abort", "all_gather_single", "all_gather_single_coalesced", "all_to_all_single",
    "allgather", "allgather_coalesced", "allgather_into_tensor_coalesced", "allreduce",
    "allreduce_coalesced", "alltoall", "alltoall_base", "barrier", "bound_device_id", "boxed",
    "broadcast", "gather", "get_group_store", "group_desc", "group_name", "merge_remote_group",
    "monitored_barrier", "name", "rank", "recv", "recv_anysource", "reduce", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "scatter", "send", "set_timeout", "shutdown", "size",
    "split_group", "unbox", "use_pg_for_symm_mem_rendezvous",
})


def c10d_reason(name: str, obj) -> str | None:
    """Why public callable `name` (`obj`) of torch.distributed / distributed_c10d is fine as it
    is: wrapped, or needs no wrapper. None: unaccounted for (tests/test_capture_coverage.py)."""
    import inspect

    if name in API_TABLE:
        return "wrapped"
    for d in (SPECIAL, SKIPPED, CLASS_REASONS):
        if name in d:
            return d[name]
    if name.startswith(NON_COMMUNICATING_PREFIXES):
        return "query or configuration function (name pattern)"
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception class"
        if name.endswith("Options"):
            return "options passed to a ProcessGroup method; no communication"
        if any(c.__name__ == "Store" for c in obj.__mro__):
            return "key-value store (rendezvous traffic, not a process-group op)"
    return None


def param_index(fn, spec: ApiSpec) -> dict[str, int]:
    """Positions of `fn`'s parameters (from its signature, or the spec's positional list)."""
    if spec.positional:
        return {n: i for i, n in enumerate(spec.positional)}
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return {}
    return {p.name: i for i, p in enumerate(params)
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}


@dataclass
class Reader:
    """Compiled reader of one API: positions resolved against the installed signature."""

    api: str
    spec: ApiSpec
    idx: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)

    @classmethod
    def build(cls, api: str, fn, spec: ApiSpec) -> "Reader":
        r = cls(api, spec, param_index(fn, spec))
        try:
            for p in inspect.signature(fn).parameters.values():
                if p.default is not p.empty:
                    r.defaults[p.name] = p.default
        except (TypeError, ValueError):
            pass
        return r

    def slot(self, name) -> tuple:
        """``(position, name, default)`` of parameter `name` for inline lookups:
        ``args[i] if i < len(args) else kwargs.get(name, default)``. A parameter that cannot be
        passed positionally (or no parameter) gets position 2**30."""
        if not name:
            return 1 << 30, None, None
        i = self.idx.get(name)
        return (1 << 30 if i is None else i), name, self.defaults.get(name)

    def arg(self, args, kwargs, name):
        """Value of parameter `name` in this call (its default when not passed)."""
        if not name:
            return None
        i = self.idx.get(name)
        if i is not None and i < len(args):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return self.defaults.get(name)


def tensors_of(value, kind: str) -> list:
    """Flatten the tensors held by an argument: '' = one tensor, '*' = list, '**' = list of lists."""
    if value is None:
        return []
    if kind == "":
        return [value]
    if kind == "*":
        return list(value)
    out = []
    for v in value:
        out.extend(v)
    return out


def split_param(p: str | None) -> tuple[str | None, str]:
    if p is None:
        return None, ""
    name = p.rstrip("*")
    return name, p[len(name):]
