"""The on-disk trace format: schema, writer and reader. The only place that knows file and
column names (see docs/trace-format.md).

This package imports neither torch nor the capture side. It was ``commtrace.trace`` until
0.2; ``commtrace.trace`` is now only the public context manager / decorator.
"""
