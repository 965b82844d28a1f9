"""Finding `first_op_init_stall`: the first op on a group pays a one-off set-up cost that the
later ones do not. On NCCL that is the lazy communicator initialisation (hundreds of ms); on
gloo (this sample on CPU) the first functional collective imports and sets up the functional
collectives machinery (about a second), while later ones return at once.

    commtrace run -- torchrun --nproc-per-node 2 samples/findings/first_op_init_stall.py
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# 8 steps: 7 collectives after the first, too few for a straggler by construction (two ranks
# reach the straggler's z 3 only from 9 collectives all arrived last at), so a rank that a loaded
# machine slows throughout cannot add a straggler finding to this sample's one (issue 14).
STEPS = 8

dist.init_process_group("gloo")
group = dist.new_group([0, 1])  # a fresh group, as tensor or pipeline parallelism creates
x = torch.ones(1 << 12)
for step in range(STEPS):
    y = funcol.all_reduce(x, "sum", group)  # the first call carries the set-up
    y = funcol.wait_tensor(y)
dist.destroy_process_group()
