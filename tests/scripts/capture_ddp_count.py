"""Run samples/ddp_mlp.py while counting, independently of commtrace, how many times DDP calls
the comm hook registered on its reducer (whoever registered it). Writes COUNT_DIR/rank<r>.json."""

import atexit
import json
import os
import runpy
import sys

import torch.distributed as dist

calls = {"n": 0}
_orig = dist._register_comm_hook


def _counting_register(reducer, state, hook):
    def counted(state_, bucket):
        calls["n"] += 1
        return hook(state_, bucket)

    return _orig(reducer, state, counted)


dist._register_comm_hook = _counting_register


@atexit.register
def _write():
    d = os.environ["COUNT_DIR"]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(calls, f)


sample = os.path.join(os.path.dirname(__file__), "..", "..", "samples", "ddp_mlp.py")
sys.argv = [sample] + sys.argv[1:]
runpy.run_path(sample, run_name="__main__")
