"""Compare two report dicts (or any JSON-like values): every number equal within rounding
(relative 1e-9), everything else exactly. Used where two paths must give one answer (the
chunked on-disk analysis, the Spark engine)."""

from __future__ import annotations

import json
import math


def differences(a, b, path: str = "", rel: float = 1e-9, abs_: float = 1e-12) -> list[str]:
    """Human-readable differences between `a` and `b` (empty when they agree)."""
    a = json.loads(json.dumps(a, default=str))
    b = json.loads(json.dumps(b, default=str))
    out: list[str] = []
    _cmp(a, b, path, out, rel, abs_)
    return out


def _cmp(x, y, path, out, rel, abs_):
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            if k not in x or k not in y:
                out.append(f"{path}.{k}: only in {'second' if k not in x else 'first'}")
                continue
            _cmp(x[k], y[k], f"{path}.{k}", out, rel, abs_)
    elif isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            out.append(f"{path}: {len(x)} vs {len(y)} items")
            return
        for i, (u, v) in enumerate(zip(x, y)):
            _cmp(u, v, f"{path}[{i}]", out, rel, abs_)
    elif isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool) and not isinstance(y, bool):
        if not math.isclose(float(x), float(y), rel_tol=rel, abs_tol=abs_):
            out.append(f"{path}: {x!r} vs {y!r}")
    elif x != y:
        out.append(f"{path}: {x!r} vs {y!r}")


def assert_same(a, b, what: str = "reports") -> None:
    diff = differences(a, b)
    assert not diff, f"{what} differ in {len(diff)} place(s): " + "; ".join(diff[:12])
