"""Memory settings for the Arrow/Parquet writer inside a rank.

A traced rank pays a fixed resident-memory cost for writing Parquet: the pyarrow libraries
(about 30 MB of code pages and relocations) and the allocator behind Arrow's default memory
pool. pyarrow's default pool is mimalloc. With its default ``arena_eager_commit`` setting,
mimalloc commits its first 1 GiB arena eagerly, and on Linux it asks for transparent huge
pages there. The first Parquet write then leaves about 8 MB resident, although the writer
never holds more than a few hundred kB (measured with ``benchmarks/soak.py``; see the Soak
section of ``docs/performance.md``).

mimalloc reads its options once, when ``libarrow`` is loaded, so they cannot be changed from
inside a rank that has already imported pyarrow. `commtrace run` passes them to the traced
command's environment (:func:`allocator_env`). A value the user set is kept. The settings only
change when mimalloc commits memory, not what the program computes.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Environment set for the traced command (when not already set). ``0``: commit arena memory
#: on demand instead of eagerly, so no huge pages are faulted in for the small writer buffers.
ALLOCATOR_ENV: dict[str, str] = {"MIMALLOC_ARENA_EAGER_COMMIT": "0"}


def allocator_env(base: Mapping[str, str]) -> dict[str, str]:
    """Variables of :data:`ALLOCATOR_ENV` missing from `base` (the user's values win)."""
    return {k: v for k, v in ALLOCATOR_ENV.items() if k not in base}
