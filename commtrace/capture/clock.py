"""Clock alignment: each rank's offset to rank 0, measured once at process-group init.

Method ``tcp-pingpong`` (metrics.md, "Clock alignment"): rank 0 opens a private TCP socket and
publishes its address in the rendezvous store (one ``set``; other ranks one ``get``). Each other
rank makes a few round trips on that socket: it reads its clock (t0), asks rank 0 for rank 0's
clock (r), reads its clock again (t1), and keeps the round trip with the smallest t1 - t0. Then

    clock_offset_ns = (t0 + t1) / 2 - r        (this rank's clock minus rank 0's clock)

and analysis aligns a time with ``t - clock_offset_ns``. Nothing goes through the user's
process groups, so their sequence numbers are untouched. Times are the recorder's clock,
including any injected test skew (``COMMTRACE_CLOCK_SKEW``), which is how tests show that the
offset is really measured.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from datetime import timedelta

from . import log

KEY = "commtrace/clock/addr"
ROUNDS = 16
_result: tuple | None = None


def _candidate_hosts() -> list[str]:
    hosts = []
    for h in (os.environ.get("MASTER_ADDR"), socket.gethostname()):
        if h and h not in hosts:
            hosts.append(h)
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if ip not in hosts:
            hosts.append(ip)
    except OSError:
        pass
    hosts.append("127.0.0.1")
    return hosts


def _serve(srv: socket.socket, n_clients: int, now_ns, timeout: float) -> None:
    srv.settimeout(timeout)
    threads = []
    try:
        for _ in range(n_clients):
            try:
                conn, _addr = srv.accept()
            except OSError:
                break
            t = threading.Thread(target=_serve_one, args=(conn, now_ns), daemon=True)
            t.start()
            threads.append(t)
    finally:
        srv.close()


def _serve_one(conn: socket.socket, now_ns) -> None:
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(30.0)
        while True:
            b = conn.recv(1)
            if not b or b != b"p":
                break
            conn.sendall(struct.pack("<q", now_ns()))
    except OSError:
        pass
    finally:
        conn.close()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return buf


#: Backends whose ranks are not processes of their own (torch's ``fake`` backend simulates a
#: world of any size in one process, for dry runs): there is no other clock to measure.
SIMULATED_BACKENDS = ("fake",)


def _unsupported(e: BaseException) -> bool:
    """A store that does not implement set/get/wait (FakeStore raises "Not implemented")."""
    return isinstance(e, (NotImplementedError, AttributeError)) or "not implemented" in str(e).lower()


def measure(store, rank: int, world_size: int, now_ns, timeout: float = 20.0,
            backend: str | None = None) -> tuple:
    """(clock_offset_ns, method, rtt_ns) of this rank against rank 0; measured once per process.
    Never raises. Where no exchange is possible (a simulated backend, a store that implements
    no set/get) the offset is None and the method starts with ``"unknown"``, quietly: analysis
    then treats the offset as 0 and draws nothing from it. On other failures the offset is 0
    and the method says why."""
    global _result
    if _result is not None:
        return _result
    if backend in SIMULATED_BACKENDS:
        _result = (None, f"unknown: {backend} backend (simulated ranks)", None)
        return _result
    if world_size <= 1 or rank == 0:
        if rank == 0 and world_size > 1 and store is not None:
            srv = None
            try:
                srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                srv.bind(("0.0.0.0", 0))
                srv.listen(min(world_size, 1024))
                port = srv.getsockname()[1]
                threading.Thread(target=_serve, args=(srv, world_size - 1, now_ns, 120.0),
                                 name="commtrace-clock", daemon=True).start()
                store.set(KEY, json.dumps({"hosts": _candidate_hosts(), "port": port}))
            except Exception as e:
                if srv is not None:
                    srv.close()
                if _unsupported(e):
                    _result = (0, "reference (store cannot publish: other ranks' offsets unknown)", 0)
                    return _result
                log.warn_once("clock-serve", "clock alignment server failed", e)
        _result = (0, "reference" if rank == 0 else "single", 0)
        return _result
    if store is None:
        _result = (0, "none: no store", None)
        return _result
    try:
        store.wait([KEY], timedelta(seconds=timeout))
        addr = json.loads(store.get(KEY).decode())
    except Exception as e:
        if _unsupported(e):
            _result = (None, "unknown: the store cannot share rank 0's address", None)
            return _result
        log.warn_once("clock-store", "clock alignment: rank 0 address not found", e)
        _result = (0, "none: no address", None)
        return _result
    sock = None
    for host in addr.get("hosts", []):
        try:
            sock = socket.create_connection((host, int(addr["port"])), timeout=3.0)
            break
        except OSError:
            sock = None
    if sock is None:
        _result = (0, "none: cannot connect", None)
        return _result
    best = None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(10.0)
        for _ in range(ROUNDS):
            t0 = now_ns()
            sock.sendall(b"p")
            r = struct.unpack("<q", _recv_exact(sock, 8))[0]
            t1 = now_ns()
            rtt = t1 - t0
            if best is None or rtt < best[0]:
                best = (rtt, (t0 + t1) // 2 - r)
        sock.sendall(b"q")
    except OSError as e:
        log.warn_once("clock-rtt", "clock alignment failed", e)
    finally:
        sock.close()
    if best is None:
        _result = (0, "none: no round trip", None)
    else:
        _result = (int(best[1]), "tcp-pingpong", int(best[0]))
    return _result


def reset() -> None:
    global _result
    _result = None
