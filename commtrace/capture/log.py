"""Logging inside a rank: everything goes to stderr with a ``commtrace:`` prefix, and each
distinct problem is reported once, so that a failing hook never floods a training log.

Nothing in :mod:`commtrace.capture` raises into user code; it calls :func:`warn_once` instead.
"""

from __future__ import annotations

import logging
import sys

_logger = logging.getLogger("commtrace")
if not _logger.handlers:
    _h = logging.StreamHandler(sys.stderr)
    _h.setFormatter(logging.Formatter("commtrace: %(message)s"))
    _logger.addHandler(_h)
    _logger.propagate = False
    _logger.setLevel(logging.INFO)

_seen: set = set()


def warn_once(key, msg: str, exc: BaseException | None = None) -> None:
    """Log `msg` (and `exc`) once per `key`; never raises."""
    try:
        if key in _seen:
            return
        _seen.add(key)
        if exc is not None:
            msg = f"{msg}: {type(exc).__name__}: {exc}"
        _logger.warning(msg)
    except Exception:  # pragma: no cover - logging itself failed
        pass


def info(msg: str) -> None:
    """Log an informational line."""
    try:
        _logger.info(msg)
    except Exception:  # pragma: no cover
        pass


def debug(msg: str) -> None:
    try:
        _logger.debug(msg)
    except Exception:  # pragma: no cover
        pass
