"""DDP's all-reduce issued by the Reducer for a Python hook (Reducer._run_allreduce_hook, C++),
as torch's mixed-precision and optimizer-in-backward hooks do (both need an accelerator; the
script's hook is built the same way: the Reducer's all-reduce, wait, divide). Under commtrace
it is issued through the recorded all_reduce on the model's group: one op row per bucket
(api ddp_comm_hook, the bucket in `detail`), no unexplained gap, and the parameters bit for
bit those of the untraced run."""

from __future__ import annotations

import json
import os

from conftest import launch_cmd, load_rows, run_plain, run_traced

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ddp_reducer_hook.py")


def test_reducer_allreduce_from_a_python_hook_is_recorded_and_unchanged(tmp_path):
    plain, traced = tmp_path / "plain", tmp_path / "traced"
    # both through the light launcher (tests/launch_ranks.py): DDP under `commtrace run --
    # torchrun` is test_ddp_hook's recording-group job
    run_plain(launch_cmd(SCRIPT, plain), timeout=240)
    run_traced(tmp_path / "run", launch_cmd(SCRIPT, traced), timeout=240)
    rows = load_rows(tmp_path / "run")
    for rank in (0, 1):
        a = json.loads((tmp_path / f"plain.rank{rank}").read_text())
        b = json.loads((tmp_path / f"traced.rank{rank}").read_text())
        assert a["params"] == b["params"] and a["calls"] == b["calls"] >= 4
        mine = [r for r in rows if r["rank"] == rank]
        hook = [r for r in mine if r["kind"] == "op" and r["api"] == "ddp_comm_hook"]
        assert len(hook) == b["calls"], [(r["api"], r["op"]) for r in mine if r["kind"] == "op"]
        assert all(r["op"] == "all_reduce" and r["pg"] == "0" and json.loads(r["detail"])["ddp_bucket"] >= 0
                   and r["t_end_ns"] for r in hook)
        # the only unrecorded collectives are the bucket rebuild's, named
        gaps = [json.loads(r["detail"]) for r in mine if r["kind"] == "gap"]
        assert [g.get("origin") for g in gaps] == ["ddp_rebuild_buckets"], gaps
