"""The on-disk trace format: schema, writer and reader. The only place that knows file and
column names (see docs/trace-format.md).

``commtrace.trace`` is also the public context manager / decorator. Once this package is
imported Python resolves the attribute ``commtrace.trace`` to the package, so the package module
itself is callable and forwards to :class:`commtrace.capture.api.trace` (imported on first call,
which keeps this package free of torch).
"""

import sys as _sys
import types as _types


class _CallableTraceModule(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        from ..capture.api import trace as _trace

        return _trace(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableTraceModule
