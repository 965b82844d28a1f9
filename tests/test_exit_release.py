"""commtrace holds no process group to the interpreter's finalisation.

Torch 2.13's gloo can abort a process at exit ("terminate called without an active exception",
pytorch/pytorch#179291; docs/faq.md) when a group's worker thread needs the GIL while Python
finalises. commtrace must not make that more likely: the groups it looked up (``_pg_cache``,
the C fast path's, the functional collectives' names) are dropped at destroy_process_group and
at the recorder's close (atexit), so a group the user destroyed and dropped is freed then, as
without commtrace. World size 1 on gloo with a HashStore: no ports, one process per case.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import clean_env

CASE = r"""
import gc, json, sys, weakref
import torch, torch.distributed as dist
traced = sys.argv[1] != "-"
if traced:
    import commtrace
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
if traced:
    commtrace.enable(output=sys.argv[1])
import torch.distributed._functional_collectives as fc
g = dist.group.WORLD
out = {}
if sys.argv[2] == "funcol":
    r = fc.all_reduce(torch.ones(3), "sum", g)
    out["funcol"] = r.wait().tolist() if hasattr(r, "wait") else r.tolist()
    del r
x = torch.ones(2)
dist.all_reduce(x)
out["c10d"] = x.tolist()

def held():
    from commtrace.capture import funcol as F, wrappers as W
    return [len(W._pg_cache), len(F._name_cache)]

if traced:
    out["held_before"] = held()
ref = weakref.ref(g)
if sys.argv[3] == "close":
    commtrace.disable()          # the recorder's close, as at exit: the group still exists
    out["held_after"] = held()
    out["group_alive"] = ref() is not None
    dist.destroy_process_group()
else:
    dist.destroy_process_group()
    del g
    gc.collect()
    if traced:
        out["held_after"] = held()
    out["group_freed"] = ref() is None
print("CASE " + json.dumps(out))
"""


def _case(tmp_path, traced: bool, ops: str, end: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CASE, str(tmp_path / "t") if traced else "-", ops, end],
                       env=clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.split("CASE ", 1)[1])


def test_destroy_frees_the_group_under_commtrace_as_without(tmp_path):
    plain = _case(tmp_path, False, "c10d", "destroy")
    traced = _case(tmp_path, True, "c10d", "destroy")
    assert plain == {"c10d": [1.0, 1.0], "group_freed": True}
    assert traced["c10d"] == [1.0, 1.0]
    assert traced["held_before"] == [1, 0]      # the world group, looked up by the c10d wrapper
    assert traced["held_after"] == [0, 0]
    assert traced["group_freed"] is True       # commtrace kept no reference of its own


def test_destroy_drops_the_functional_collectives_group_names(tmp_path):
    d = _case(tmp_path, True, "funcol", "destroy")
    assert d["funcol"] == [1.0, 1.0, 1.0] and d["c10d"] == [1.0, 1.0]
    assert d["held_before"] == [1, 1]           # the funcol cache held the group and its PgInfo
    assert d["held_after"] == [0, 0]


def test_close_drops_every_cached_group(tmp_path):
    d = _case(tmp_path, True, "funcol", "close")
    assert d["held_before"] == [1, 1]
    assert d["held_after"] == [0, 0]
    assert d["group_alive"] is True             # the user's group itself is untouched
