"""commtrace.trace as a context manager and a decorator under plain torchrun (no commtrace run).
Sizes tell the calls apart: 7 before, 11 inside, 13 after, 17 in the decorated function, 19
after it. P2POps are built before tracing is on and used inside."""

import sys

import torch
import torch.distributed as dist

import commtrace


def main():
    out, out2 = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    r = dist.get_rank()
    peer = 1 - r
    pre_ops = [dist.P2POp(dist.isend, torch.ones(3), peer),
               dist.P2POp(dist.irecv, torch.zeros(3), peer)]
    dist.all_reduce(torch.ones(7))
    with commtrace.trace(output=out):
        commtrace.enable()
        commtrace.enable(output=out)  # twice: same as once
        assert commtrace.is_enabled()
        dist.all_reduce(torch.ones(11))
        for w in dist.batch_isend_irecv(pre_ops):
            w.wait()
        commtrace.mark_step(5)
        w = dist.all_reduce(torch.ones(11), async_op=True)
        w.wait()
    assert not commtrace.is_enabled()
    dist.all_reduce(torch.ones(13))

    @commtrace.trace(output=out2)
    def decorated():
        dist.broadcast(torch.ones(17), src=0)

    decorated()
    dist.all_reduce(torch.ones(19))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
