"""One rank (world size 1). A sys.exit(5) caught by the script never ends the process; then
`top`: sys.exit(6) from a function, through a `finally:` and a `with` block, uncaught (exit
status 6); `caught`: the script ends normally (exit status 0)."""

import contextlib
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
dist.all_reduce(torch.ones(4))
try:
    sys.exit(5)
except SystemExit:
    pass


def leave():
    try:
        sys.exit(6)
    finally:
        torch.ones(1)  # cleanup that lets the SystemExit go on


dist.all_reduce(torch.ones(4))
if sys.argv[1] == "top":
    with contextlib.nullcontext():
        leave()
