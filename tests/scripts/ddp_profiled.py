"""samples/ddp_mlp.py's model and step (no planted straggler), the whole run under
torch.profiler: writes OUT.<rank> with the gloo worker ranges (name, start, end in epoch ns),
the independent record of every collective gloo ran, whoever issued it (DDP's C++ reducer
included)."""

import json
import os
import sys

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "samples"))
import ddp_mlp  # noqa: E402

out = sys.argv[1]
args = ddp_mlp.parse_args(["--steps", "4", "--straggler-ms", "0"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
import torch  # noqa: E402

with profile(activities=[ProfilerActivity.CPU]) as prof:
    state = ddp_mlp.setup(args, rank, world, torch.device("cpu"))
    for step in range(args.steps):
        loss = ddp_mlp.train_step(state, step)
path = f"{out}.{rank}.kineto.json"
prof.export_chrome_trace(path)
with open(path) as f:
    d = json.load(f)
base = int(d.get("baseTimeNanoseconds", 0))
ev = []
for e in d.get("traceEvents", []):
    if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:"):
        t0 = base + int(round(float(e["ts"]) * 1000))
        ev.append([e["name"], t0, t0 + int(round(float(e.get("dur", 0)) * 1000))])
os.remove(path)
with open(f"{out}.{rank}", "w") as f:
    json.dump(sorted(ev, key=lambda x: x[1]), f)
os.write(1, f"RESULT {rank} {loss.item():.6f}\n".encode())
dist.destroy_process_group()
