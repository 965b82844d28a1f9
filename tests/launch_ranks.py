"""A light stand-in for ``torchrun --standalone --nproc-per-node N script args`` (the test
suite's jobs that are not about the launcher): it starts the N ranks of one node with the
environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT
with a port free on 127.0.0.1, the TORCHELASTIC_* run variables, OMP_NUM_THREADS=1) and waits
for them, without importing torch: torchrun's own interpreter pays torch's import (about 3 s
of CPU here) and its rendezvous for every job, a third of a 2-rank job's start-up CPU.

As torchrun does: the ranks run ``python -u script args`` and share this process's stdout and
stderr; the first rank that fails gets the others terminated (SIGTERM, then SIGKILL after 30 s)
and the launcher exits with 1; SIGTERM / SIGINT to the launcher is passed on to the ranks.

    python tests/launch_ranks.py --nproc-per-node N script [args...]

Jobs that test what a user meets (``commtrace run -- torchrun ...``, the launcher's signals,
its process tree) keep torchrun (tests/conftest.py ``torchrun_cmd``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--nproc-per-node":
        sys.stderr.write(__doc__)
        return 2
    n = int(argv[1])
    cmd = [sys.executable, "-u", *argv[2:]]
    base = dict(os.environ)
    base.setdefault("OMP_NUM_THREADS", "1")
    base.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(n),
        "TORCHELASTIC_RUN_ID": uuid.uuid4().hex[:8], "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
    })
    procs = []
    for r in range(n):
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r), ROLE_RANK=str(r))
        procs.append(subprocess.Popen(cmd, env=env))

    codes: dict[int, int] = {}   # pid -> exit code (negative: the signal)

    def kill(signum):
        # os.kill, not Popen's methods: those poll, and a child reaped there is lost to os.wait
        for p in procs:
            if p.pid not in codes:
                try:
                    os.kill(p.pid, signum)
                except ProcessLookupError:
                    pass

    def forward(signum, _frame):
        kill(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while len(codes) < n:
        pid, status = os.wait()      # blocks; retried after a forwarded signal (PEP 475)
        codes[pid] = os.waitstatus_to_exitcode(status)
        if codes[pid] != 0 and len(codes) < n:
            kill(signal.SIGTERM)
            end = time.monotonic() + 30
            while len(codes) < n:
                for p in procs:
                    if p.pid not in codes:
                        got, st = os.waitpid(p.pid, os.WNOHANG)
                        if got:
                            codes[got] = os.waitstatus_to_exitcode(st)
                if time.monotonic() > end:
                    kill(signal.SIGKILL)
                time.sleep(0.05)
    for p in procs:
        p.returncode = codes[p.pid]
    bad = [(r, codes[p.pid]) for r, p in enumerate(procs) if codes[p.pid] != 0]
    if bad:
        sys.stderr.write(f"launch_ranks: rank(s) failed (rank, exit code): {bad}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
