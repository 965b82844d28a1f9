"""What one blocking op through commtrace's C wrapper touches on cold caches, counted under
callgrind (instructions, simulated cache misses): the same on a loaded machine as on a quiet one.

    python benchmarks/footprint.py                        # needs valgrind; ~2 minutes
    python benchmarks/footprint.py --pythonpath /tmp/old  # another copy of the package (A/B)

Issue 20, session 14: at 2 ranks every blocking op starts on cold caches (its previous wait
slept while gloo's threads, the other rank and other processes ran), so what the wrapper adds
there is mostly the number of distinct memory lines of its own code and data it touches per
op. Timing that on a shared 2-core machine moves by +-1 us between runs; counting does not.

Method: one process, world size 1 (gloo), commtrace on (stack and NVTX on, as overhead.py),
an all_reduce of 16 float32 through commtrace's wrapper on a group of its own. Before each op
an 8 MB buffer is written (one byte per 64-byte line, outside the counted region), which
empties the simulated data caches (D1 32 KB, LL 4 MB). callgrind counts only inside the
wrapper (`--toggle-collect=ctx_vectorcall`: torch's own all_reduce inside it too, the same for
both builds of an A/B). Two processes, with N1 and N2 ops, and the difference / (N2 - N1) is
per op (the warm-up and first-sight work cancel). Printed per op: Ir (instructions), D1mr +
D1mw (data lines missed in L1: touched), DLmr + DLmw (data lines from memory, LL cold), I1mr
(instruction lines missed in L1), ILmr. The wrapper's own code is also given alone: the
events of functions in the _fastpath module (self cost).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

EVENTS = ["Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw"]


def _child(n_ops: int, sweep_kb: int, async_op: bool = False) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import free_port

    import torch
    import torch.distributed as dist

    import commtrace

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    tmp = tempfile.mkdtemp(prefix="commtrace-footprint-")
    commtrace.enable(output=tmp, stack=True, nvtx=True)
    g = dist.new_group([0])
    t = torch.ones(16)
    junk = bytearray(sweep_kb * 1024)
    ones = b"\x01" * (len(junk) // 64)
    if async_op:
        def op():
            dist.all_reduce(t, group=g, async_op=True).wait()
    else:
        def op():
            dist.all_reduce(t, group=g)
    for _ in range(20):   # first sight: group, device, call site
        op()
    for _ in range(n_ops):
        junk[::64] = ones
        op()
    commtrace.disable()
    dist.destroy_process_group()


def _run(n_ops: int, sweep_kb: int, pythonpath: str | None, out: str, async_op: bool = False,
         whole: bool = False) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    if whole:   # every thread, everything (the sweep too: the same in both runs of an A/B)
        collect = ["--collect-atstart=yes"]
    else:
        collect = ["--collect-atstart=no", "--toggle-collect=ctx_vectorcall"]
        if async_op:   # the op's wait() too (commtrace's Work.wait wrapper)
            collect.append("--toggle-collect=wait_vectorcall")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *collect,
           "--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=4194304,16,64",
           sys.executable, os.path.abspath(__file__), "--child", str(n_ops), "--sweep-kb",
           str(sweep_kb)] + (["--async-op"] if async_op else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"callgrind run failed ({p.returncode}): {p.stderr[-2000:]}")
    return _parse(out)


def _parse(path: str) -> dict:
    """{'total': {event: n}, 'own': {event: n}}: all collected events (the file's summary), and
    the self cost of the functions of the _fastpath module (from callgrind_annotate)."""
    events, total = None, {}
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith(("summary:", "totals:")) and events:
                total = dict(zip(events, map(int, line.split()[1:])))
    own = dict.fromkeys(EVENTS, 0)
    p = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100",
                        f"--show={','.join(EVENTS)}", path], capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if "_fastpath.cpython" not in line:
            continue
        nums = re.sub(r"\(\s*[\d.]+%\)", "", line).split()
        vals = []
        for tok in nums:
            if re.fullmatch(r"[\d,]+|\.", tok):
                vals.append(0 if tok == "." else int(tok.replace(",", "")))
            else:
                break
        for e, v in zip(EVENTS, vals):
            own[e] += v
    return {"total": total, "own": own}


def _per_op(a: dict, b: dict, n: int) -> dict:
    return {e: (b.get(e, 0) - a.get(e, 0)) / n for e in EVENTS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ops", type=int, nargs=2, default=[100, 400], metavar=("N1", "N2"))
    ap.add_argument("--sweep-kb", type=int, default=8192)
    ap.add_argument("--pythonpath", default=None,
                    help="put this folder first on PYTHONPATH (another copy of commtrace)")
    ap.add_argument("--async-op", action="store_true",
                    help="all_reduce(async_op=True).wait(): the async path, its wait() counted too")
    ap.add_argument("--whole", action="store_true",
                    help="count the whole process, every thread (the backend's completion "
                         "callback, the writer thread), not only inside the wrapper")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="keep callgrind's two output files in DIR (callgrind_annotate)")
    args = ap.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.sweep_kb, args.async_op)
        return 0
    n1, n2 = args.ops
    if n2 <= n1 or n1 < 0:
        ap.error("--ops N1 N2: 0 <= N1 < N2")
    with tempfile.TemporaryDirectory() as tmp:
        d = args.keep or tmp
        os.makedirs(d, exist_ok=True)
        kw = {"async_op": args.async_op, "whole": args.whole}
        r1 = _run(n1, args.sweep_kb, args.pythonpath, os.path.join(d, f"callgrind.{n1}.out"), **kw)
        r2 = _run(n2, args.sweep_kb, args.pythonpath, os.path.join(d, f"callgrind.{n2}.out"), **kw)
    for part in ("total", "own"):
        po = _per_op(r1[part], r2[part], n2 - n1)
        d1 = po["D1mr"] + po["D1mw"]
        dl = po["DLmr"] + po["DLmw"]
        label = ("the whole process" if args.whole else
                 "in ctx_vectorcall" + (" and wait_vectorcall" if args.async_op else "") +
                 " (incl. torch's call)") if part == "total" else \
            "_fastpath's own functions (self)"
        print(f"{label}: Ir {po['Ir']:.0f}, I1 misses {po['I1mr']:.1f}, "
              f"IL misses {po['ILmr']:.1f}, D1 misses {d1:.1f}, DL misses {dl:.1f} per op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
