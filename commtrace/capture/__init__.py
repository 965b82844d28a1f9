"""Everything that runs inside a rank: wrappers, DDP hook, functional collectives, completion
clocks, recorder and writer. Import-light: never imports dash, plotly, duckdb or pandas.

Public entry points live in :mod:`commtrace.capture.api` (re-exported by ``commtrace``).
"""
