"""Point-to-point ops on gloo and torch's sequence number (issue 20): gloo numbers each send,
recv, isend and irecv once, so the C fast path reads the number once per such op (as for a
collective), not before and after it. Plants unrecorded p2p ops (the ProcessGroup's C++ entry
points: torch 2.13's own ``send`` issues the wrapped ``isend``) before recorded blocking and
async ones, so that the gap rows show the single read still
finds them. Prints, per rank:

    NUMBERED <rank> <torch seq added by one send or recv of the C++ entry points>
    READS <rank> <recorded p2p ops> <torch seq reads by the C path over them, -1: no C path>
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
peer = 1 - rank
pg = dist.distributed_c10d._get_default_group()


def pg_send(x, dst):
    pg.send([x], dst, 0).wait()


def pg_recv(x, src):
    pg.recv([x], src, 0).wait()


def p2p(send_first, fn_send=dist.send, fn_recv=dist.recv):
    x = torch.full((8,), float(rank))
    if (rank == 0) == send_first:
        fn_send(x, peer)
    else:
        fn_recv(x, peer)


x = torch.ones(4)
dist.all_reduce(x)                       # recorded: torch seq 1 (and the C path warm)
p2p(True)                                # recorded: 2
a = pg._get_sequence_number_for_group()
p2p(False, pg_send, pg_recv)   # planted: 3
os.write(1, f"NUMBERED {rank} {pg._get_sequence_number_for_group() - a}\n".encode())
from commtrace.capture import wrappers   # noqa: E402  (traced by `commtrace run`)

reads = getattr(wrappers._cfast, "tseq_reads", None)   # None: no C path (COMMTRACE_PURE_PYTHON)
r0 = reads() if reads else 0
n = 0
for i in range(3):                       # recorded blocking: 4, 5, 6 (after the gap of 3)
    p2p(i % 2 == 0)
    n += 1
p2p(True, pg_send, pg_recv)    # planted: 7, 8
p2p(False, pg_send, pg_recv)
t = torch.full((8,), float(rank))
ws = [dist.isend(t, peer) if rank == 0 else dist.irecv(t, peer)]   # recorded async: 9
ws.append(dist.irecv(torch.zeros(8), peer) if rank == 0 else dist.isend(t, peer))   # 10
for w in ws:
    w.wait()
n += 2
r1 = reads() if reads else -1
os.write(1, f"READS {rank} {n} {r1 - r0 if reads else -1}\n".encode())
dist.barrier()                           # recorded: 11
dist.destroy_process_group()
