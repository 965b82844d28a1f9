"""The analysis side of commtrace: loading a trace, matching, wait states, findings, root cause.

Imported only by the `commtrace` command and by programs that analyse traces, never inside a rank.
"""

#: Whether the root-cause model may tune glibc's malloc for this process (model.py,
#: `_retain_freed_memory`). The `commtrace` command sets it; a library user may.
TUNE_MALLOC = False


def in_thread(fn, *args, name: str = "commtrace"):
    """`fn(*args)` in a new thread named `name`; returns its future (`.result()` re-raises its
    error). The analysis' one way to run a part beside another (report, what-if, overlap)."""
    from concurrent.futures import ThreadPoolExecutor
    ex = ThreadPoolExecutor(1, thread_name_prefix=name)
    fut = ex.submit(fn, *args)
    ex.shutdown(wait=False)
    return fut
