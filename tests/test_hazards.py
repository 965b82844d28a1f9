"""Use-before-wait detection with a fake recorder (the hooks of docs/dev/interfaces.md)."""

from __future__ import annotations

import inspect
import threading
import types

import pytest
import torch

from commtrace.capture import hazards, registry

ORIG = {n: torch.Tensor.__dict__.get(n, getattr(torch.Tensor, n)) for n in hazards.BASIC_METHODS}


class FakeRecorder:
    def __init__(self):
        self.rows = []
        self.pending = {}
        self.listeners = []
        self.lock = threading.Lock()

    def emit(self, **fields):
        self.rows.append(fields)

    def pending_ops(self):
        return dict(self.pending)

    def add_pending_listener(self, fn):
        self.listeners.append(fn)

    def _notify(self, n):
        for fn in self.listeners:
            fn(n)

    # Like the real recorder: change under the lock, notify outside it.
    def issue(self, op_id, tensors, op="all_reduce"):
        with self.lock:
            n0 = len(self.pending)
            self.pending[op_id] = types.SimpleNamespace(
                op_id=op_id, op=op, api="all_reduce", site=None, tensors=tensors,
                async_op=True, waited=False)
        if n0 == 0:
            self._notify(1)

    def done(self, op_id):
        with self.lock:
            self.pending.pop(op_id, None)
            n = len(self.pending)
        if n == 0:
            self._notify(0)


@pytest.fixture(autouse=True)
def immediate_restore(monkeypatch):
    """Restore torch's methods at the first read with nothing pending (no hysteresis)."""
    monkeypatch.setattr(hazards, "UNPATCH_AFTER_S", 0.0)


@pytest.fixture
def rec():
    r = FakeRecorder()
    assert hazards.install(r, "basic")
    yield r
    hazards.uninstall()
    for n, f in ORIG.items():
        assert torch.Tensor.__dict__.get(n, getattr(torch.Tensor, n)) is f


def here(offset=1):
    f = inspect.currentframe().f_back
    return f"{f.f_code.co_filename}:{f.f_lineno + offset}"


def test_nothing_pending_leaves_torch_untouched(rec):
    t = torch.ones(3)
    assert all(torch.Tensor.__dict__.get(n, getattr(torch.Tensor, n)) is ORIG[n]
               for n in hazards.BASIC_METHODS)
    t.item if t.numel() == 1 else t.tolist()
    assert rec.rows == []


def test_item_on_pending_tensor_records_one_hazard_with_site(rec):
    t = torch.ones(1)
    rec.issue(5, [t])
    assert registry.is_wrapper(torch.Tensor.item)
    site = here()
    v = t.item()
    for _ in range(3):
        t.item()                     # same op, api and site: one row
    assert v == 1.0
    assert rec.rows[0] == dict(kind="hazard", api="Tensor.item", op="all_reduce", ref_op_id=5,
                               detail="use_before_wait", site=site)
    assert len(rec.rows) == 2        # the loop's line is a second site
    rec.done(5)
    t.item()                         # nothing pending: no row, and torch's method comes back
    assert torch.Tensor.item is ORIG["item"]
    assert len(rec.rows) == 2


def test_views_overlap_and_disjoint_slices_do_not(rec):
    bucket = torch.zeros(100)
    rec.issue(1, [bucket[:50]])
    bucket[60:].tolist()             # disjoint: fine
    bucket[60:].cpu()
    assert rec.rows == []
    bucket[40:].tolist()             # overlaps the pending half
    bucket.view(10, 10)[0].numpy()   # a view of the pending memory
    assert [(r["api"], r["ref_op_id"]) for r in rec.rows] == [("Tensor.tolist", 1),
                                                               ("Tensor.numpy", 1)]


def test_printing_gives_one_row_per_call_not_per_internal_read(rec, capsys):
    t = torch.arange(4.0)
    s = torch.tensor(2.5)
    rec.issue(2, [t, s], op="all_gather")
    print(t)
    str(t)
    repr(t)
    f"{s:.1f}"
    apis = [r["api"] for r in rec.rows]
    assert apis == ["Tensor.__str__", "Tensor.__str__", "Tensor.__repr__", "Tensor.__format__"]
    assert {r["op"] for r in rec.rows} == {"all_gather"}
    assert all(r["site"].startswith(__file__ + ":") for r in rec.rows)


def test_waited_op_is_not_a_hazard(rec):
    t = torch.ones(2)
    rec.issue(3, [t])
    rec.pending[3].waited = True     # waited, completion not seen yet
    t.tolist()
    assert rec.rows == []


def test_nested_output_lists_are_checked(rec):
    outs = [torch.zeros(2), torch.zeros(2)]
    rec.issue(4, [torch.ones(2), outs], op="all_gather")
    outs[1].tolist()
    assert [r["ref_op_id"] for r in rec.rows] == [4]


def test_listener_from_other_threads_is_safe(rec):
    t = torch.ones(1)
    errors = []

    def churn():
        try:
            for i in range(300):
                rec.issue(100 + i, [t])
                rec.done(100 + i)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    th = threading.Thread(target=churn)
    th.start()
    for _ in range(300):
        t.item()
        repr(t)
    th.join()
    assert errors == []
    assert not hazards.stats()["active"]
    t.item()
    assert torch.Tensor.item is ORIG["item"]
    assert all(r["api"] in ("Tensor.item", "Tensor.__repr__") for r in rec.rows)


def test_full_mode_catches_any_torch_op_on_a_pending_tensor():
    r = FakeRecorder()
    assert hazards.install(r, "full")
    try:
        t = torch.ones(4)
        other = torch.ones(4)
        base = torch._C._len_torch_function_stack()
        r.issue(9, [t])
        assert torch._C._len_torch_function_stack() == base + 1
        t.size(), t.shape, t.dtype, t[0], t.view(2, 2)   # metadata and views: no data read
        other * 2                                         # not pending
        assert r.rows == []
        site = here()
        y = t + 1
        torch.add(t, 1)
        t.zero_()
        t[1].item()                                       # basic reader: one row, not two
        assert [(x["api"], x["ref_op_id"]) for x in r.rows] == [
            ("Tensor.add", 9), ("torch.add", 9), ("Tensor.zero_", 9), ("Tensor.item", 9)]
        assert r.rows[0]["site"] == site
        r.done(9)
        assert torch._C._len_torch_function_stack() == base
        y + t                                             # nothing pending: no check at all
        assert len(r.rows) == 4
    finally:
        hazards.uninstall()


def test_full_mode_completion_on_another_thread_leaves_pass_through_then_pops():
    r = FakeRecorder()
    hazards.install(r, "full")
    try:
        t = torch.ones(2)
        base = torch._C._len_torch_function_stack()
        r.issue(1, [t])
        th = threading.Thread(target=r.done, args=(1,))  # a gloo thread completes it
        th.start()
        th.join()
        assert torch._C._len_torch_function_stack() == base + 1  # still ours, pass-through
        t + 1
        assert r.rows == []
        r.issue(2, [t])                                   # owner thread: already pushed
        assert torch._C._len_torch_function_stack() == base + 1
        t * 3
        r.done(2)                                         # owner thread sees 0: popped
        assert torch._C._len_torch_function_stack() == base
        assert [x["ref_op_id"] for x in r.rows] == [2]
    finally:
        hazards.uninstall()


def test_uninstall_while_pending_restores_everything():
    r = FakeRecorder()
    hazards.install(r, "full")
    base = torch._C._len_torch_function_stack()
    r.issue(1, [torch.ones(1)])
    assert torch._C._len_torch_function_stack() == base + 1
    hazards.uninstall()
    assert torch._C._len_torch_function_stack() == base
    for n, f in ORIG.items():
        assert torch.Tensor.__dict__.get(n, getattr(torch.Tensor, n)) is f
    r.done(1)                                             # listener after uninstall: no-op
    assert r.rows == []


def test_off_mode_installs_nothing():
    r = FakeRecorder()
    assert hazards.install(r, "off") is False
    r.issue(1, [torch.ones(1)])
    assert torch.Tensor.item is ORIG["item"] and r.listeners == []


def test_readers_stay_patched_briefly_then_restore(monkeypatch):
    """Hysteresis: a loop of async op + wait does not repatch torch.Tensor every iteration."""
    now = [100.0]
    monkeypatch.setattr(hazards, "UNPATCH_AFTER_S", 1.0)
    monkeypatch.setattr(hazards, "_monotonic", lambda: now[0])
    r = FakeRecorder()
    hazards.install(r, "basic")
    try:
        t = torch.ones(1)
        before = hazards.stats()["toggles"]
        for i in range(50):
            r.issue(i, [torch.ones(2)])
            t.item()
            r.done(i)
            now[0] += 0.01
        assert hazards.stats()["toggles"] - before == 1  # patched once for the 50 cycles
        t.item()
        assert registry.is_wrapper(torch.Tensor.item)  # 10 ms after the last op: kept
        now[0] += 1.0
        t.item()                                       # 1 s with nothing pending: restored
        assert torch.Tensor.item is ORIG["item"] and r.rows == []
    finally:
        hazards.uninstall()
