"""One side (server or client) of one benchmark case, run in its own process.

The parent (`python -m rsock.bench`) starts this file *by path* with the same
interpreter, so a tcp/unix case never imports the `rsock` package; only the rsock
transport imports it, lazily.  Standard library only.

    _worker.py serve  --transport T --test stream|pingpong --size S [--addr PATH] [--cpu N]
    _worker.py client --transport T --test ... --addr ADDR [test parameters]

The server prints ``READY <addr>`` once it listens; both sides print one final line
``RESULT <json>`` on stdout.  Exit status: 0 ok, 3 data verification failed, 1 error.

Wire protocol (same for every transport, client -> server unless noted):

* a phase header ``HDR`` (magic, flags, count); ``count == 0`` ends the session and
  the server answers with an ``ACK`` of zeros;
* stream: ``count`` messages of ``size`` bytes, then server -> client ``ACK``
  (number of bad messages, crc32 of the last message received);
* pingpong: ``count`` times a ``size``-byte message that the server echoes back.

Message number ``seq`` (counted over the whole session) is the window
``pattern[off:off + size]`` with ``off = (seq % NWIN) * STEP`` of one deterministic
pseudo-random pattern, so consecutive messages differ in (nearly) every byte and stale
or misplaced data cannot pass for fresh data.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import random
import resource
import socket
import struct
import sys
import time
import traceback
import zlib
from array import array
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

MAGIC = b"RSBH"
HDR = struct.Struct("<4sIQ")  # magic, flags, message count
ACK = struct.Struct("<II")  # bad messages, crc32 of the last message
FLAG_FULL_VERIFY = 1
NWIN = 61  # distinct message windows (prime: never a divisor of a power-of-two ring)
STEP = 64  # window offset step in the pattern
STRIDE = 512  # sampled verification: one byte every STRIDE bytes, phase moves per message
PATTERN_SEED = 0x52534F434B  # "RSOCK"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_VERIFY = 3


class VerifyError(Exception):
    """Data received differs from what was sent."""


class StreamSocket(Protocol):
    """What the benchmark needs of a connected socket (stdlib or rsock)."""

    def sendall(self, data: ReadableBuffer, /) -> None: ...

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = ..., /) -> int: ...

    def close(self) -> None: ...


def pattern(size: int) -> bytes:
    """The deterministic pattern that every message is a window of."""
    return random.Random(PATTERN_SEED).randbytes(size + NWIN * STEP)


def windows(pat: bytes, size: int) -> list[memoryview]:
    view = memoryview(pat)
    return [view[w * STEP : w * STEP + size] for w in range(NWIN)]


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def recv_exact(sock: StreamSocket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        r = sock.recv_into(view[got:n])
        if r == 0:
            raise ConnectionError(f"peer closed the connection after {got} of {n} bytes")
        got += r


def first_difference(a: memoryview, b: memoryview) -> int:
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return -1


# --------------------------------------------------------------------------- transports


def socket_module(transport: str) -> Any:
    """The module whose ``socket`` class the transport uses (rsock imported lazily)."""
    if transport == "rsock":
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(os.path.dirname(here))
        if root not in sys.path:
            sys.path.insert(0, root)
        mod = importlib.import_module("rsock")
        if not hasattr(mod, "socket"):
            where = getattr(mod, "__file__", None) or list(getattr(mod, "__path__", []))
            raise ImportError(f"rsock at {where} has no 'socket' (is the engine built?)")
        return mod
    return socket


def new_socket(transport: str) -> Any:
    if transport == "unix":
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return socket_module(transport).socket(socket.AF_INET, socket.SOCK_STREAM)


def tune(sock: Any, transport: str) -> None:
    if transport == "tcp":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def transport_info(transport: str, conn: Any) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if transport == "rsock":
        mod = sys.modules.get("rsock")
        info["rsock_file"] = getattr(mod, "__file__", None)
        info["rsock_version"] = getattr(mod, "__version__", None)
        info["provider"] = getattr(conn, "provider", None)
        stats = getattr(conn, "stats", None)
        if callable(stats):
            try:
                info["stats"] = stats()
            except Exception as exc:  # noqa: BLE001 - diagnostics only
                info["stats_error"] = repr(exc)
    return info


# --------------------------------------------------------------------------- server


def serve(args: argparse.Namespace) -> dict[str, Any]:
    listener = new_socket(args.transport)
    if args.transport == "unix":
        listener.bind(args.addr)
        addr = args.addr
    else:
        listener.bind(("127.0.0.1", 0))
        addr = str(listener.getsockname()[1])
    listener.listen(1)
    print(f"READY {addr}", flush=True)
    conn, _ = listener.accept()
    listener.close()
    tune(conn, args.transport)
    phases: list[dict[str, Any]] = []  # filled as phases complete, kept if one fails
    try:
        if args.test == "stream":
            serve_stream(conn, args.size, phases)
        else:
            serve_pingpong(conn, args.size, phases)
        info = transport_info(args.transport, conn)
    except Exception:
        if any(p.get("nbad") for p in phases):  # report the corruption, not its aftermath
            raise VerifyError(server_verify_error(phases)) from None
        raise
    finally:
        conn.close()
    result: dict[str, Any] = {"ok": True, "phases": phases, **info}
    if any(p.get("nbad") for p in phases):
        result.update(ok=False, verify_error=server_verify_error(phases))
    return result


def server_verify_error(phases: list[dict[str, Any]]) -> str:
    bad = sum(p.get("nbad", 0) for p in phases)
    first = next(p for p in phases if p.get("nbad"))
    return (
        f"received {bad} corrupt message(s); first: message {first['first_bad_seq']}"
        f" differs from byte {first['first_bad_offset']} on"
    )


def read_header(conn: StreamSocket, hbuf: memoryview) -> tuple[int, int]:
    recv_exact(conn, hbuf, HDR.size)
    magic, flags, count = HDR.unpack(hbuf)
    if magic != MAGIC:
        raise VerifyError(f"stream out of sync: expected a phase header, got {bytes(hbuf)!r}")
    return flags, count


def serve_stream(conn: StreamSocket, size: int, phases: list[dict[str, Any]]) -> None:
    pat = pattern(size)
    wins = windows(pat, size)
    rbuf = bytearray(size)
    rv = memoryview(rbuf)
    hbuf = memoryview(bytearray(HDR.size))
    stride = min(STRIDE, size)
    small = size <= 4 * 16
    seq = 0
    while True:
        flags, count = read_header(conn, hbuf)
        if count == 0:
            conn.sendall(ACK.pack(0, 0))
            return
        full = bool(flags & FLAG_FULL_VERIFY) or small
        nbad = 0
        first_bad_seq = first_bad_off = -1
        c0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        for _ in range(count):
            recv_exact(conn, rv, size)
            exp = wins[seq % NWIN]
            if full:
                ok = rbuf == exp
            else:
                ph = seq % stride
                ok = (
                    rv[:16] == exp[:16]
                    and rv[-16:] == exp[-16:]
                    and rv[ph::stride] == exp[ph::stride]
                )
            if not ok:
                if not nbad:
                    first_bad_seq, first_bad_off = seq, first_difference(rv, exp)
                nbad += 1
            seq += 1
        conn.sendall(ACK.pack(nbad, zlib.crc32(rbuf)))
        t1 = time.perf_counter_ns()
        c1 = cpu_seconds()
        phase: dict[str, Any] = {
            "count": count,
            "full_verify": full,
            "ns": t1 - t0,
            "cpu_s": c1 - c0,
            "nbad": nbad,
        }
        if nbad:
            phase["first_bad_seq"] = first_bad_seq
            phase["first_bad_offset"] = first_bad_off
        phases.append(phase)


def serve_pingpong(conn: StreamSocket, size: int, phases: list[dict[str, Any]]) -> None:
    rv = memoryview(bytearray(size))
    hbuf = memoryview(bytearray(HDR.size))
    while True:
        _, count = read_header(conn, hbuf)
        if count == 0:
            conn.sendall(ACK.pack(0, 0))
            return
        c0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        for _ in range(count):
            recv_exact(conn, rv, size)
            conn.sendall(rv)
        t1 = time.perf_counter_ns()
        phases.append({"count": count, "ns": t1 - t0, "cpu_s": cpu_seconds() - c0})


# --------------------------------------------------------------------------- client


def connect(args: argparse.Namespace) -> Any:
    sock = new_socket(args.transport)
    if args.transport == "unix":
        sock.connect(args.addr)
    else:
        sock.connect(("127.0.0.1", int(args.addr)))
    tune(sock, args.transport)
    return sock


def end_session(conn: StreamSocket) -> None:
    conn.sendall(HDR.pack(MAGIC, 0, 0))
    abuf = memoryview(bytearray(ACK.size))
    recv_exact(conn, abuf, ACK.size)


class StreamClient:
    def __init__(self, conn: StreamSocket, size: int, fault: str) -> None:
        self.conn = conn
        self.size = size
        self.fault = fault
        self.pat = pattern(size)
        self.wins = windows(self.pat, size)
        self.crcs = [zlib.crc32(w) for w in self.wins]
        self.abuf = memoryview(bytearray(ACK.size))
        self.seq = 0

    def phase(self, count: int, full: bool, kind: str) -> dict[str, Any]:
        conn, wins, seq0 = self.conn, self.wins, self.seq
        bad_at = -1
        if self.fault == "flip" or (self.fault == "stale" and kind == "rep"):
            bad_at = count // 2
        c0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        conn.sendall(HDR.pack(MAGIC, FLAG_FULL_VERIFY if full else 0, count))
        if bad_at < 0:
            for k in range(seq0, seq0 + count):
                conn.sendall(wins[k % NWIN])
        else:
            for i in range(count):
                w = wins[(seq0 + i) % NWIN]
                if i == bad_at:
                    w = self.faulty(w, seq0 + i)
                conn.sendall(w)
        recv_exact(conn, self.abuf, ACK.size)
        t1 = time.perf_counter_ns()
        c1 = cpu_seconds()
        self.seq = seq0 + count
        nbad, crc = ACK.unpack(self.abuf)
        expected_crc = self.crcs[(self.seq - 1) % NWIN]
        result = {
            "kind": kind,
            "count": count,
            "bytes": count * self.size,
            "ns": t1 - t0,
            "cpu_s": c1 - c0,
            "ack_nbad": nbad,
            "ack_crc_ok": crc == expected_crc,
        }
        if nbad:
            raise VerifyError(f"{kind}: server reported {nbad} corrupt message(s) of {count}")
        if crc != expected_crc:
            raise VerifyError(
                f"{kind}: ack crc32 {crc:#010x} of the last message, expected {expected_crc:#010x}"
            )
        return result

    def faulty(self, w: memoryview, seq: int) -> memoryview:
        """Self-test hook (--fault): a corrupted or stale message."""
        if self.fault == "stale":
            return self.wins[(seq - 1) % NWIN]
        data = bytearray(w)
        data[len(data) // 3] ^= 0x01
        return memoryview(data)


def client_stream(conn: StreamSocket, args: argparse.Namespace) -> dict[str, Any]:
    size: int = args.size
    cl = StreamClient(conn, size, args.fault)
    phases: list[dict[str, Any]] = []
    warm = max(4, -(-args.warmup_bytes // size))
    phases.append(cl.phase(warm, True, "warmup"))
    rate = phases[-1]["bytes"] / max(phases[-1]["ns"], 1) * 1e9  # bytes/s
    cal = max(4, int(rate * min(0.2, args.rep_time / 2) / size))
    phases.append(cl.phase(cal, args.verify == "full", "calibrate"))
    rate = phases[-1]["bytes"] / max(phases[-1]["ns"], 1) * 1e9
    count = min(max(4, round(rate * args.rep_time / size)), 10**8)
    for _ in range(args.reps):
        phases.append(cl.phase(count, args.verify == "full", "rep"))
    end_session(conn)
    return {"ok": True, "phases": phases}


def client_pingpong(conn: StreamSocket, args: argparse.Namespace) -> dict[str, Any]:
    size: int = args.size
    wins = windows(pattern(size), size)
    rbuf = bytearray(size)
    rv = memoryview(rbuf)
    phases: list[dict[str, Any]] = []
    samples = array("q")
    seq = 0
    for kind, count in (("warmup", args.warmup_rounds), ("rep", args.rounds)):
        if count <= 0:
            continue
        samples = array("q", bytes(8 * count))
        conn.sendall(HDR.pack(MAGIC, 0, count))
        nbad = 0
        c0 = cpu_seconds()
        w0 = time.perf_counter_ns()
        for i in range(count):
            msg = wins[seq % NWIN]
            t0 = time.perf_counter_ns()
            conn.sendall(msg)
            got = conn.recv_into(rv, size)
            if got < size:
                if got == 0:
                    raise ConnectionError("peer closed the connection during ping-pong")
                recv_exact(conn, rv[got:], size - got)
            t1 = time.perf_counter_ns()
            samples[i] = t1 - t0
            if rbuf != msg:
                nbad += 1
            seq += 1
        w1 = time.perf_counter_ns()
        c1 = cpu_seconds()
        phases.append({"kind": kind, "count": count, "ns": w1 - w0, "cpu_s": c1 - c0})
        if nbad:
            raise VerifyError(f"ping-pong {kind}: {nbad} of {count} echoes differ from the message")
    end_session(conn)
    return {"ok": True, "phases": phases, "rtt_ns": samples.tolist()}


def client(args: argparse.Namespace) -> dict[str, Any]:
    conn = connect(args)
    try:
        if args.fault == "hang":
            time.sleep(10**6)
        if args.test == "stream":
            result = client_stream(conn, args)
        else:
            result = client_pingpong(conn, args)
        result.update(transport_info(args.transport, conn))
    finally:
        conn.close()
    return result


# --------------------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rsock.bench worker")
    ap.add_argument("role", choices=("serve", "client"))
    ap.add_argument("--transport", required=True, choices=("rsock", "tcp", "unix"))
    ap.add_argument("--test", required=True, choices=("stream", "pingpong"))
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--addr", default="")
    ap.add_argument("--cpu", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rep-time", type=float, default=1.0)
    ap.add_argument("--warmup-bytes", type=int, default=64 << 20)
    ap.add_argument("--verify", choices=("sample", "full"), default="sample")
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--warmup-rounds", type=int, default=2000)
    ap.add_argument("--fault", choices=("", "flip", "stale", "hang"), default="")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]  # run as a script: don't let the bench directory shadow modules
    args = parse(argv)
    # A hang anywhere (even inside a C call without the GIL) dumps the stacks and exits.
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    result: dict[str, Any]
    code = EXIT_OK
    try:
        if args.cpu >= 0:
            os.sched_setaffinity(0, {args.cpu})
        result = serve(args) if args.role == "serve" else client(args)
        if not result.get("ok"):
            code = EXIT_VERIFY
    except VerifyError as exc:
        result, code = {"ok": False, "verify_error": str(exc)}, EXIT_VERIFY
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        traceback.print_exc()
        result, code = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, EXIT_ERROR
    result["affinity"] = sorted(os.sched_getaffinity(0))
    result["pid"] = os.getpid()
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
