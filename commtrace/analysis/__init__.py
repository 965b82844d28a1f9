"""The analysis side of commtrace: loading a trace, matching, wait states, findings, root cause.

Imported only by the `commtrace` command and by programs that analyse traces, never inside a rank.
"""

#: Whether the root-cause model may tune glibc's malloc for this process (model.py,
#: `_retain_freed_memory`). The `commtrace` command sets it; a library user may.
TUNE_MALLOC = False
