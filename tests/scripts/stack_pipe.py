"""torch.distributed.pipelining, 2 stages on 2 ranks, ScheduleGPipe or Schedule1F1B, 4
microbatches, 3 steps (the last 2 counted). Planted: stage 0's forward sleeps --delay-ms per microbatch, so stage 1
waits for each activation (late_sender, rank 0 -> rank 1)."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.profiler import ProfilerActivity, profile

from stack_common import finish, shutdown

ap = argparse.ArgumentParser()
ap.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
ap.add_argument("--delay-ms", type=float, default=30.0)
ap.add_argument("--counts", default="")
args = ap.parse_args()
dist.init_process_group("gloo")
r = dist.get_rank()
torch.manual_seed(0)
layers = [nn.Linear(8, 8), nn.Linear(8, 4)]


class Slow(nn.Module):
    def __init__(self, inner, delay_s):
        super().__init__()
        self.inner, self.delay_s = inner, delay_s

    def forward(self, x):
        time.sleep(self.delay_s)
        return torch.relu(self.inner(x))


if r == 0:
    mod = Slow(layers[0], args.delay_ms / 1000)
    stage = PipelineStage(mod, 0, 2, torch.device("cpu"))
else:
    mod = layers[1]
    stage = PipelineStage(mod, 1, 2, torch.device("cpu"))
Sched = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
sched = Sched(stage, n_microbatches=4, loss_fn=lambda out, tgt: (out - tgt).pow(2).mean())
opt = torch.optim.SGD(mod.parameters(), lr=0.1)
x = torch.randn(8, 8)
tgt = torch.randn(8, 4)
outs = []


def step():
    if r == 0:
        sched.step(x)
    else:
        losses = []
        out = sched.step(target=tgt, losses=losses)
        outs.extend([out.detach()] + [loss.detach().reshape(1) for loss in losses])
    opt.step()
    opt.zero_grad()


step()   # the first step infers the stages' shapes (object send/recv): not counted
t0 = time.time_ns()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(2):
        step()
t1 = time.time_ns()
finish(r, outs + [p.detach() for p in mod.parameters()], prof, args.counts, {"window": [t0, t1]})
del sched, stage, mod, opt, outs, prof
shutdown()
