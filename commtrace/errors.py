"""One error family for everything a user can act on.

The CLI turns any :class:`CommtraceError` into a one-line message and a non-zero exit code.
Inside a training process nothing of ours may raise into user code: capture code catches and
logs instead (see :mod:`commtrace.capture.log`).
"""


class CommtraceError(Exception):
    """Base class: the message is shown to the user as one line."""

    exit_code = 2


class TraceFormatError(CommtraceError):
    """A file or directory is not a readable commtrace trace (corrupt, truncated, foreign)."""


class EmptyTraceError(TraceFormatError):
    """A run directory holds no trace parts at all."""


class SchemaVersionError(TraceFormatError):
    """A trace was written by a newer, incompatible schema version."""


class UsageError(CommtraceError):
    """Bad command-line usage or options."""


class OutputError(CommtraceError):
    """An output location cannot be created or written."""
