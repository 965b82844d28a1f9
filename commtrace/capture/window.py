"""Bounded capture: which steps are recorded op by op, what the others keep, and how much disk a
rank may use (docs/large-jobs.md).

* ``--steps A:B`` records the ops of steps A..B-1; ``--schedule wait=W,active=A,repeat=R``
  records, like torch.profiler's schedule, A steps after every W skipped ones, R times (0:
  forever). Steps are the recorder's (``optimizer.step`` or ``commtrace.mark_step``), the same
  number on every rank of an SPMD job, so a collective is in the window on all its ranks or on
  none.
* Outside the window no op row is written; each step keeps one small **counter row** per op
  kind (``kind="counter"``: `op`, `step`, `bytes` summed, `t_enqueue_ns` / `t_return_ns` of the
  first / last call, and in `detail` the JSON ``{"ops": n, "blocked_ns": ..., "inflight_ns":
  ...}``), so that a run always has its whole step history. Step markers are always kept.
* ``--on-demand`` records no op row until ``commtrace trigger DIR --steps N`` (class
  Trigger: every rank starts at the step rank 0 publishes in the store).
* ``--max-size`` bounds a rank's op parts: after each part, the oldest ones are deleted (ring
  retention) and ``rank=<r>/_retention.json`` says what was dropped; counters go to separate
  ``counters-*.parquet`` parts that retention never deletes.

The filter runs on the writer thread at flush, on the column lists the recorder is about to
write: nothing changes on the training thread. Never raises into the caller.
"""

from __future__ import annotations

import json
import os
import re

from ..format import schema as S

KIND_COUNTER = "counter"
COUNTERS_PREFIX = "counters-"
RETENTION_NAME = "_retention.json"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4, "ki": 1024, "mi": 1024 ** 2,
          "gi": 1024 ** 3}


def parse_size(text) -> int:
    """'500MB', '2GiB', '1e6'... -> bytes. Raises ValueError on anything else."""
    if text is None or str(text).strip() == "":
        return 0
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 500MB, 2GB)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def parse_steps(text) -> tuple[int | None, int | None] | None:
    """'A:B' -> (A, B), half-open, either side optional; '' -> None."""
    if text is None or str(text).strip() == "":
        return None
    a, sep, b = str(text).partition(":")
    if not sep:
        raise ValueError(f"steps must be A:B (half-open, either side optional), got {text!r}")
    try:
        lo = int(a) if a.strip() else None
        hi = int(b) if b.strip() else None
    except ValueError:
        raise ValueError(f"steps must be A:B with integers, got {text!r}") from None
    if lo is not None and hi is not None and hi <= lo:
        raise ValueError(f"steps {text!r}: B must be greater than A")
    return lo, hi


def parse_schedule(text) -> tuple[int, int, int] | None:
    """'wait=W,active=A,repeat=R' (any order; repeat defaults to 0 = forever) -> (W, A, R)."""
    if text is None or str(text).strip() == "":
        return None
    vals = {"wait": 0, "active": None, "repeat": 0}
    for part in str(text).split(","):
        k, sep, v = part.partition("=")
        k = k.strip().lower()
        if not sep or k not in vals:
            raise ValueError(f"schedule must be wait=W,active=A,repeat=R, got {text!r}")
        try:
            vals[k] = int(v)
        except ValueError:
            raise ValueError(f"schedule {k} must be an integer, got {v!r}") from None
        if vals[k] < 0:
            raise ValueError(f"schedule {k} must be >= 0")
    if not vals["active"]:
        raise ValueError(f"schedule needs active=A with A >= 1, got {text!r}")
    return vals["wait"], vals["active"], vals["repeat"]


class Window:
    """Which steps are recorded op by op (see the module doc)."""

    def __init__(self, steps=None, schedule=None):
        self.steps = steps
        self.schedule = schedule

    @classmethod
    def from_config(cls, cfg) -> "Window | None":
        """The window of a capture config, None when everything is recorded (the default)."""
        steps = parse_steps(getattr(cfg, "steps", "") or "")
        sched = parse_schedule(getattr(cfg, "schedule", "") or "")
        if steps is None and sched is None:
            return None
        return cls(steps, sched)

    def recorded(self, step) -> bool:
        """Whether the ops of `step` are recorded (ops before the first step are step 0)."""
        s = int(step or 0)
        if self.steps is not None:
            lo, hi = self.steps
            if (lo is not None and s < lo) or (hi is not None and s >= hi):
                return False
        if self.schedule is not None:
            w, a, r = self.schedule
            base = self.steps[0] if self.steps and self.steps[0] is not None else 0
            k = s - base
            cycle, pos = divmod(k, w + a)
            if pos < w or (r and cycle >= r):
                return False
        return True

    def split(self, cols: list[list], columns: list[str], recorded=None):
        """Split the column lists of a part (schema order `columns`) into the rows to write and
        the counter rows of the others (`recorded(step)`, default this window's). Returns
        (kept columns, counter columns or None)."""
        recorded = recorded or self.recorded
        idx = {c: i for i, c in enumerate(columns)}
        kind, step = cols[idx["kind"]], cols[idx["step"]]
        n = len(kind)
        keep = []
        drop = []
        for i in range(n):
            k = kind[i]
            if k == S.KIND_MARK or k == KIND_COUNTER or k == S.KIND_GAP or recorded(step[i]):
                keep.append(i)
            else:
                drop.append(i)
        if not drop:
            return cols, None
        kept = [[c[i] for i in keep] for c in cols]
        return kept, self._counters(cols, idx, drop, columns)

    @staticmethod
    def _counters(cols, idx, rows, columns) -> list[list]:
        g: dict = {}
        get = lambda name, i: cols[idx[name]][i]  # noqa: E731
        for i in rows:
            k = get("kind", i)
            op = get("op", i) if k == S.KIND_OP else k  # sync / hazard rows count under their kind
            key = (int(get("step", i) or 0), op, get("pg", i) if k == S.KIND_OP else None)
            t0, t1 = get("t_enqueue_ns", i), get("t_return_ns", i)
            tw, twe, te = get("t_wait_ns", i), get("t_wait_end_ns", i), get("t_end_ns", i)
            blocked = (t1 - t0 if t0 is not None and t1 is not None else 0) + (
                twe - tw if tw is not None and twe is not None else 0)
            inflight = te - t0 if te is not None and t0 is not None else 0
            a = g.get(key)
            if a is None:
                a = g[key] = {"ops": 0, "bytes": 0, "blocked_ns": 0, "inflight_ns": 0, "t0": t0, "t1": t1,
                              "rank": get("rank", i), "thread": get("thread", i)}
            a["ops"] += 1
            a["bytes"] += int(get("bytes", i) or 0)
            a["blocked_ns"] += max(0, blocked)
            a["inflight_ns"] += max(0, inflight)
            if t0 is not None and (a["t0"] is None or t0 < a["t0"]):
                a["t0"] = t0
            if t1 is not None and (a["t1"] is None or t1 > a["t1"]):
                a["t1"] = t1
        out = {c: [] for c in columns}
        for (step, op, pg), a in sorted(g.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), str(kv[0][2]))):
            row = {"kind": KIND_COUNTER, "rank": a["rank"], "step": step, "op": op, "pg": pg,
                   "bytes": a["bytes"], "t_enqueue_ns": a["t0"], "t_return_ns": a["t1"], "thread": a["thread"],
                   "detail": json.dumps({"ops": a["ops"], "blocked_ns": a["blocked_ns"],
                                         "inflight_ns": a["inflight_ns"]}, separators=(",", ":"))}
            for c in columns:
                out[c].append(row.get(c))
        return [out[c] for c in columns]


class Retention:
    """Ring retention of one rank's op parts under `max_bytes` (--max-size)."""

    def __init__(self, run_dir: str, rank: int, max_bytes: int):
        self.run_dir = run_dir
        self.rank = rank
        self.max_bytes = int(max_bytes)
        self.parts: list[dict] = []   # oldest first: path, bytes, rows, first/last step
        self.dropped = {"parts": 0, "rows": 0, "bytes": 0, "first_step": None, "last_step": None,
                        "files": []}

    def added(self, path: str, rows: int, steps) -> None:
        """Account for a part just written; delete the oldest ones while over the limit (the
        newest part always stays) and rewrite ``_retention.json``."""
        try:
            size = os.path.getsize(path)
        except OSError:
            return
        st = [int(s) for s in steps if s is not None]
        self.parts.append({"path": path, "bytes": size, "rows": rows,
                           "first_step": min(st) if st else None, "last_step": max(st) if st else None})
        total = sum(p["bytes"] for p in self.parts)
        changed = False
        while total > self.max_bytes and len(self.parts) > 1:
            p = self.parts.pop(0)
            try:
                os.unlink(p["path"])
            except OSError:
                continue
            total -= p["bytes"]
            d = self.dropped
            d["parts"] += 1
            d["rows"] += p["rows"]
            d["bytes"] += p["bytes"]
            if p["first_step"] is not None:
                d["first_step"] = p["first_step"] if d["first_step"] is None else min(d["first_step"], p["first_step"])
                d["last_step"] = p["last_step"] if d["last_step"] is None else max(d["last_step"], p["last_step"])
            d["files"] = (d["files"] + [os.path.basename(p["path"])])[-100:]
            changed = True
        if changed:
            from ..format import writer as W
            W.atomic_write_text(os.path.join(W.rank_dir(self.run_dir, self.rank), RETENTION_NAME),
                                json.dumps({"rank": self.rank, "max_size_bytes": self.max_bytes,
                                            "kept_bytes": total, "dropped": self.dropped}))


#: `commtrace trigger DIR --steps N` writes this file in the run (or output) directory.
TRIGGER_NAME = "_trigger.json"
#: A triggered window starts this many steps after rank 0's step when it reads the trigger, so
#: that no rank has written (or dropped) a step of the window before it knows of it.
TRIGGER_MARGIN_STEPS = 3
TRIGGER_KEY = "commtrace/trigger/"


def write_trigger(run_dir: str, steps: int) -> dict:
    """Ask the job writing `run_dir` to record its next `steps` steps exactly (the CLI's
    `commtrace trigger`). Returns what was written."""
    import time
    import uuid

    from ..format import writer as W
    trig = {"id": uuid.uuid4().hex[:12], "steps": int(steps), "t_ns": time.time_ns()}
    W.atomic_write_text(os.path.join(run_dir, TRIGGER_NAME), json.dumps(trig))
    return trig


class Trigger:
    """On-demand windows: each rank reads ``_trigger.json`` at its flushes; rank 0 picks the
    first step (its step + TRIGGER_MARGIN_STEPS) and publishes it in the job's store, the others
    take it from there, so every rank records the same steps."""

    def __init__(self):
        self.seen: set = set()
        self.windows: list[tuple[int, int]] = []

    def poll(self, rec) -> None:
        for d in (rec.run_dir, os.path.dirname(os.path.abspath(rec.run_dir))):
            p = os.path.join(d, TRIGGER_NAME)
            try:
                with open(p) as f:
                    trig = json.load(f)
                tid, n = str(trig["id"]), int(trig["steps"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if tid in self.seen or n < 1:
                continue
            store = getattr(rec, "store", None)
            key = TRIGGER_KEY + tid
            if rec.rank == 0 or store is None:
                start = int(rec.step or 0) + TRIGGER_MARGIN_STEPS
                if store is not None:
                    store.set(key, str(start))
            else:
                if not store.check([key]):
                    continue  # rank 0 has not read it yet: next flush
                start = int(store.get(key).decode())
            self.seen.add(tid)
            self.windows.append((start, start + n))

    def recorded(self, step) -> bool:
        s = int(step or 0)
        return any(a <= s < b for a, b in self.windows)


class Bounded:
    """The recorder's hook: a Window, on-demand windows (Trigger) and/or a Retention (see the
    module doc)."""

    def __init__(self, window: Window | None, retention: Retention | None, columns: list[str],
                 on_demand: bool = False, rec=None):
        self.window = window
        self.retention = retention
        self.columns = list(columns)
        self.on_demand = on_demand
        # triggers make sense wherever steps are left out
        self.trigger = Trigger() if (on_demand or window is not None) else None
        self.rec = rec
        self._counter_index = 0

    @classmethod
    def for_recorder(cls, rec, columns) -> "Bounded | None":
        cfg = rec.config
        win = Window.from_config(cfg)
        on_demand = bool(getattr(cfg, "on_demand", False))
        max_bytes = parse_size(getattr(cfg, "max_size", "") or "")
        ret = Retention(rec.run_dir, rec.rank, max_bytes) if max_bytes > 0 else None
        if win is None and ret is None and not on_demand:
            return None
        return cls(win, ret, columns, on_demand=on_demand, rec=rec)

    def recorded(self, step) -> bool:
        if self.trigger is not None and self.trigger.recorded(step):
            return True
        if self.window is not None:
            return self.window.recorded(step)
        return not self.on_demand

    def split(self, cols):
        if self.trigger is not None and self.rec is not None:
            try:
                self.trigger.poll(self.rec)
            except Exception:  # noqa: BLE001 -- a store gone at exit: no new window
                pass
        if self.window is None and not self.on_demand:
            return cols, None
        return Window.split(self.window or Window(), cols, self.columns, self.recorded)

    def written(self, path: str, rows: int, steps) -> None:
        if self.retention is not None:
            self.retention.added(path, rows, steps)

    def write_counters(self, rec, counters) -> None:
        from ..format import writer as W
        table = W.rows_to_table_nopandas({c: list(counters[i]) for i, c in enumerate(self.columns)})
        self._counter_index += 1
        W.write_part(rec.run_dir, rec.rank, table, rec._metadata(), index=self._counter_index,
                     prefix=COUNTERS_PREFIX)
