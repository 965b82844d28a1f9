"""commtrace: a communication profiler and tracer for PyTorch distributed training.

Library use::

    import commtrace
    with commtrace.trace(output="traces/run1"):
        train()
    run = commtrace.load("traces/run1")

Importing this package is cheap: the capture side and the analysis side are imported on first
use, and the capture side never imports dash, plotly, duckdb or pandas.
"""

__version__ = "0.1.0"

_CAPTURE_API = ("trace", "enable", "disable", "mark_step", "is_enabled")
_ANALYSIS_API = ("load",)

__all__ = list(_CAPTURE_API + _ANALYSIS_API) + ["CommtraceError", "__version__"]

from .errors import CommtraceError  # noqa: E402  (light: no imports)


def __getattr__(name):
    if name in _CAPTURE_API:
        from .capture import api

        return getattr(api, name)
    if name in _ANALYSIS_API:
        from .analysis import run as _run

        return getattr(_run, name)
    raise AttributeError(f"module 'commtrace' has no attribute {name!r}")
