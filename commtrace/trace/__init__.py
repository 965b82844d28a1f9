"""The on-disk trace format: schema, writer and reader. The only place that knows file and
column names (see docs/trace-format.md)."""
