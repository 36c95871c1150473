"""One side (server or client) of one benchmark case, run in its own process.

The parent (`python -m rsock.bench`) starts this file *by path* with the same
interpreter, so a tcp/unix case never imports the `rsock` package; only the rsock
transport imports it, lazily.  Standard library only.

    _worker.py serve  --transport T --test stream|msgrate|pingpong|connrate|idle|rate
                      --size S [--addr PATH] [--cpu N] [--idle-time SECONDS]
                      [--api sync|asyncio] [--loop asyncio|uvloop]
                      [--msgrate-recv bulk|message]
    _worker.py client --transport T --test ... --addr ADDR [test parameters]

T is rsock, tcp, unix or ucxx (pingpong only, always on an event loop; imported only
then).  RSOCK_SPIN_US and RSOCK_PROVIDER come from the environment the parent gives.

``--api sync`` uses blocking sockets; ``--api asyncio`` runs an event loop on both
sides with Protocols (no streams): tcp/unix over the loop's own ``create_server`` /
``create_connection`` (``create_unix_*``), rsock over ``rsock.asyncio``'s.  The wire
protocol, verification and accounting are the same in both.

The server prints ``READY <addr>`` once it listens; both sides print one final line
``RESULT <json>`` on stdout.  Exit status: 0 ok, 3 data verification failed, 1 error.

Wire protocol (same for every transport, client -> server unless noted):

* a phase header ``HDR`` (magic, flags, count); ``count == 0`` ends the session and
  the server answers with an ``ACK`` of zeros;
* stream: ``count`` messages of ``size`` bytes, then server -> client ``ACK``
  (number of bad messages, crc32 of the last message received);
* msgrate: the stream protocol with small (64 B) messages, every byte verified; the
  server reads them in bulk (``--msgrate-recv bulk``, the default: whatever has arrived,
  up to BULK bytes per ``recv_into``, as netperf's TCP_STREAM -m 64 receiver does) or
  one ``recv_into`` per message (``message``);
* pingpong: ``count`` times a ``size``-byte message that the server echoes back;
* rate: the pingpong protocol (the same server), but the client sends its 64-byte
  messages on a fixed schedule (``--rate`` per second) without waiting for the echoes,
  each carrying its sequence number; see ``_rate.py``;
* connrate (sync api only): no phase header; every connection carries one byte
  ``seq % 255`` that the server checks against its own count, echoes, then closes
  (server-side close first, so TIME_WAIT stays off the client's ephemeral ports); a
  last connection with ``QUIT`` ends the session.
* idle (sync api only): ``--size`` connections; ``IDLE_GO`` on the first one, the
  server answers with the idle window (start, end on CLOCK_MONOTONIC), both wait on
  all connections until its end, then ``IDLE_WAKE`` on every connection, echoed.

rsock results carry ``provider``, ``stats`` (the session's counters) and ``rsock_opts``
(the tunables in force, ``spin_us`` included) of one connection.

Message number ``seq`` (counted over the whole session) is the window
``pattern[off:off + size]`` with ``off = (seq % NWIN) * STEP`` of one deterministic
pseudo-random pattern, so consecutive messages differ in (nearly) every byte and stale
or misplaced data cannot pass for fresh data.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import importlib
import json
import os
import random
import resource
import selectors
import socket
import struct
import sys
import time
import traceback
import zlib
from array import array
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

if __package__:
    from rsock.bench import _rate
else:  # run by path (the parent does): the sibling module is on sys.path[0]
    import _rate  # type: ignore[import-not-found,no-redef]

MAGIC = b"RSBH"
HDR = struct.Struct("<4sIQ")  # magic, flags, message count
ACK = struct.Struct("<II")  # bad messages, crc32 of the last message
FLAG_FULL_VERIFY = 1
NWIN = 61  # distinct message windows (prime: never a divisor of a power-of-two ring)
STEP = 64  # window offset step in the pattern
QUIT = 0xFF  # connrate: the byte of the last connection (sequence bytes are 0..254)
IDLE_GO = b"G"  # idle: all connections are up (client -> server, first connection)
IDLE_WAKE = b"W"  # idle: the window is over (client -> server on every connection, echoed)
IDLE_WINDOW = struct.Struct("<QQ")  # idle: window start, end (CLOCK_MONOTONIC ns)
IDLE_LEAD_NS = 50_000_000  # idle: the window starts this long after the server sets it
BLOCK = 128  # sampled verification: one BLOCK-byte block per message, a different one each time
BULK = 65536  # msgrate bulk receive: bytes asked for per recv_into (netperf's -M)
PATTERN_SEED = 0x52534F434B  # "RSOCK"
SYNC_ONLY = ("idle",)  # tests without an asyncio variant

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
    if n <= 0:
        return
    recv_rest(sock, view, n, sock.recv_into(view, n))  # most often all of it: no slice


def recv_rest(sock: StreamSocket, view: memoryview, n: int, got: int) -> None:
    """The rest of ``recv_exact`` after a first ``recv_into`` that returned ``got``."""
    if got == 0:
        raise ConnectionError(f"peer closed the connection after 0 of {n} bytes")
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


def rsock_asyncio() -> Any:
    """``rsock.asyncio`` (imports rsock)."""
    socket_module("rsock")
    return importlib.import_module("rsock.asyncio")


def new_socket(transport: str) -> Any:
    if transport == "unix":
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return socket_module(transport).socket(socket.AF_INET, socket.SOCK_STREAM)


def tune(sock: Any, transport: str) -> None:
    if transport == "tcp":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def tune_transport(transport: asyncio.BaseTransport, kind: str) -> None:
    """TCP_NODELAY like the sync mode (asyncio and uvloop set it already)."""
    sock = transport.get_extra_info("socket")
    if kind == "tcp" and sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def api_info(args: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {"api": args.api}
    if args.api == "asyncio":
        loop = asyncio.get_running_loop()
        info["loop"] = args.loop
        info["loop_class"] = f"{type(loop).__module__}.{type(loop).__qualname__}"
        if args.loop == "uvloop":
            info["uvloop_version"] = getattr(sys.modules.get("uvloop"), "__version__", None)
    return info


def run_async(
    args: argparse.Namespace,
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
) -> dict[str, Any]:
    """Run ``main(args)`` on a fresh event loop of the kind ``--loop`` names."""
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if args.loop == "uvloop":
        factory = importlib.import_module("uvloop").new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main(args))


def transport_info(transport: str, conn: Any) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if transport == "rsock":
        mod = sys.modules.get("rsock")
        info["rsock_file"] = getattr(mod, "__file__", None)
        info["rsock_version"] = getattr(mod, "__version__", None)
        info["provider"] = getattr(conn, "provider", None)
        info["provider_env"] = os.environ.get("RSOCK_PROVIDER")
        info["spin_us_env"] = os.environ.get("RSOCK_SPIN_US")
        info["loop_poll_us_env"] = os.environ.get("RSOCK_LOOP_POLL_US")
        for key, name in (("stats", "stats"), ("rsock_opts", "rsock_opts")):
            method = getattr(conn, name, None)
            if callable(method):
                try:
                    info[key] = method()
                except Exception as exc:  # noqa: BLE001 - diagnostics only
                    info[key + "_error"] = repr(exc)
    return info


def rsock_counters(transport: str, conns: list[Any]) -> dict[str, int]:
    """The sum of ``stats()`` over rsock connections ({} for other transports)."""
    total: dict[str, int] = {}
    if transport != "rsock":
        return total
    for conn in conns:
        for k, v in conn.stats().items():
            total[k] = total.get(k, 0) + int(v)
    return total


# --------------------------------------------------------------------------- server


class _Slices(dict[int, bytes]):
    """``pat[p:p + n]`` for any ``p``, sliced on first use and kept."""

    def __init__(self, pat: bytes, n: int) -> None:
        super().__init__()
        self.pat, self.n = pat, n

    def __missing__(self, p: int) -> bytes:
        v = self[p] = self.pat[p : p + self.n]
        return v


class StreamChecker:
    """Server side of the stream test: verifies each received message, times the phase.

    Shared by the sync and the asyncio server: ``begin`` after a phase header,
    ``check`` on every complete message, ``ack`` + ``end`` after the last one.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.pat = pattern(size)
        self.wins = windows(self.pat, size)
        # sampled check, no allocation per message: one BLOCK-byte block, its
        # expected bytes sliced from the pattern once and kept
        self.blk = min(BLOCK, size)
        self.nblk = -(-size // self.blk)  # the last block ends flush with the message
        self.blocks = _Slices(self.pat, self.blk)  # pattern offset -> block, made once
        # block offset by seq % nblk: a permutation of the block positions (a
        # prime step that does not divide the block count), so nblk messages
        # cover every byte offset
        step = 7919 if self.nblk % 7919 else 7907
        self.offs = [self.blk_off((k * step) % self.nblk) for k in range(self.nblk)]
        self.small = size <= 4 * 16
        self.part = 0  # bulk receive: bytes of message seq already checked
        self.expect: memoryview | None = None
        self.seq = 0
        self.count = 0
        self.full = False
        self.nbad = 0
        self.first_bad_seq = self.first_bad_off = -1
        self.c0 = 0.0
        self.t0 = 0

    def begin(self, flags: int, count: int) -> None:
        self.count = count
        self.full = bool(flags & FLAG_FULL_VERIFY) or self.small
        self.nbad = 0
        self.first_bad_seq = self.first_bad_off = -1
        self.c0 = cpu_seconds()
        self.t0 = time.perf_counter_ns()

    def blk_off(self, b: int) -> int:
        """Offset in a message of sampled block number ``b`` (the last one ends flush)."""
        return min(b * self.blk, self.size - self.blk)

    def check(self, rbuf: bytearray, rv: memoryview) -> None:
        """One complete message (``rv`` is a view of all of ``rbuf``)."""
        seq = self.seq
        w = seq % NWIN
        if self.full:
            ok = rbuf == self.wins[w]
        else:
            # one BLOCK-byte block, a different one each message, by one C call
            # and no allocation (startswith compares in place): what the check
            # costs is the same for every transport but weighs more on the
            # faster one, so it is kept to one call (~0.2 µs here; head + tail +
            # block took three and ~1.2 µs with the method call, a fifth of the
            # time rsock takes for a 64 KiB message)
            off = self.offs[seq % self.nblk]
            ok = rbuf.startswith(self.blocks[w * STEP + off], off)
        if not ok:
            self.bad(seq, first_difference(rv, self.wins[w]))
        self.seq = seq + 1

    def recv_checked(self, conn: StreamSocket, rbuf: bytearray, rv: memoryview, count: int) -> None:
        """The sync server's loop: ``count`` messages, each read whole into
        ``rbuf`` and checked; ``check`` inlined when sampled."""
        size, recv_into = self.size, conn.recv_into
        if self.full:
            check = self.check
            for _ in range(count):
                got = recv_into(rv, size)
                if got != size:
                    recv_rest(conn, rv, size, got)
                check(rbuf, rv)
            return
        startswith, offs, nblk, blocks = rbuf.startswith, self.offs, self.nblk, self.blocks
        seq0 = self.seq
        for seq in range(seq0, seq0 + count):
            got = recv_into(rv, size)  # most often the whole message at once
            if got != size:
                recv_rest(conn, rv, size, got)
            off = offs[seq % nblk]
            if not startswith(blocks[seq % NWIN * STEP + off], off):
                self.bad(seq, first_difference(rv, self.wins[seq % NWIN]))
        self.seq = seq0 + count

    def bad(self, seq: int, off: int) -> None:
        if not self.nbad:
            self.first_bad_seq, self.first_bad_off = seq, off
        self.nbad += 1

    def bulk_init(self, bufsize: int) -> None:
        """Prepare ``check_bulk`` for reads of up to ``bufsize`` bytes."""
        period = b"".join(self.wins)  # the stream repeats every NWIN messages
        reps = -(-(bufsize + len(period)) // len(period))
        self.expect = memoryview(period * reps)

    def check_bulk(self, buf: bytearray, n: int) -> None:
        """The next ``n`` bytes of the stream, in ``buf[:n]``, wherever messages
        begin and end: every byte compared (one memcmp), bad messages counted."""
        assert self.expect is not None
        size = self.size
        start = (self.seq % NWIN) * size + self.part
        exp = self.expect[start : start + n]
        if not buf.startswith(exp):
            self.bulk_bad(memoryview(buf)[:n], exp)
        total = self.part + n
        self.seq += total // size
        self.part = total % size

    def bulk_bad(self, got: memoryview, exp: memoryview) -> None:
        """Count the messages that ``got`` (the stream from message seq, byte part
        on) gets wrong."""
        size, seq, i = self.size, self.seq, 0
        pos = self.part
        while i < len(got):
            j = min(len(got), i + size - pos)
            d = first_difference(got[i:j], exp[i:j])
            if d >= 0:
                self.bad(seq, pos + d)
            i, pos, seq = j, 0, seq + 1

    def ack(self, rbuf: bytearray) -> bytes:
        return ACK.pack(self.nbad, zlib.crc32(rbuf))

    def end(self) -> dict[str, Any]:
        t1 = time.perf_counter_ns()
        c1 = cpu_seconds()
        phase: dict[str, Any] = {
            "count": self.count,
            "full_verify": self.full,
            "ns": t1 - self.t0,
            "cpu_s": c1 - self.c0,
            "nbad": self.nbad,
        }
        if self.nbad:
            phase["first_bad_seq"] = self.first_bad_seq
            phase["first_bad_offset"] = self.first_bad_off
        return phase


def serve(args: argparse.Namespace) -> dict[str, Any]:
    if args.transport == "ucxx":
        return run_async(args, userve)
    if args.api == "asyncio":
        if args.test in SYNC_ONLY:
            raise ValueError(f"{args.test} runs with the sync api only")
        return run_async(args, aserve_connrate if args.test == "connrate" else aserve)
    listener = new_socket(args.transport)
    if args.transport == "unix":
        listener.bind(args.addr)
        addr = args.addr
    else:
        listener.bind(("127.0.0.1", 0))
        addr = str(listener.getsockname()[1])
    if args.test == "connrate":
        try:
            listener.listen(128)
            print(f"READY {addr}", flush=True)
            return serve_connrate(listener, args.transport)
        finally:
            listener.close()
    if args.test == "idle":
        try:
            listener.listen(min(args.size, 4096))
            print(f"READY {addr}", flush=True)
            return serve_idle(listener, args)
        finally:
            listener.close()
    listener.listen(1)
    print(f"READY {addr}", flush=True)
    conn, _ = listener.accept()
    listener.close()
    tune(conn, args.transport)
    phases: list[dict[str, Any]] = []  # filled as phases complete, kept if one fails
    try:
        if args.test in ("stream", "msgrate"):
            serve_stream(conn, args.size, phases, bulk_recv(args))
        else:
            serve_pingpong(conn, args.size, phases)
        info = transport_info(args.transport, conn)
    except Exception:
        if any(p.get("nbad") for p in phases):  # report the corruption, not its aftermath
            raise VerifyError(server_verify_error(phases)) from None
        raise
    finally:
        conn.close()
    return server_result(phases, info)


def server_result(phases: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
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


def bulk_recv(args: argparse.Namespace) -> bool:
    """msgrate's server reads whatever has arrived, up to BULK bytes per call."""
    return bool(args.test == "msgrate" and args.msgrate_recv == "bulk")


def serve_stream(
    conn: StreamSocket, size: int, phases: list[dict[str, Any]], bulk: bool = False
) -> None:
    """The stream/msgrate server: one ``recv_exact`` + check per message, or
    (``bulk``) reads of whatever has arrived, up to BULK bytes, all but the
    last message checked chunk by chunk and the last one as a message."""
    chk = StreamChecker(size)
    rbuf = bytearray(size)
    rv = memoryview(rbuf)
    hbuf = memoryview(bytearray(HDR.size))
    bbuf = bytearray(BULK if bulk else 0)
    bv = memoryview(bbuf)
    if bulk:
        chk.bulk_init(BULK)
    while True:
        flags, count = read_header(conn, hbuf)
        if count == 0:
            conn.sendall(ACK.pack(0, 0))
            return
        chk.begin(flags, count)
        if bulk:
            left = (count - 1) * size
            while left:
                n = conn.recv_into(bv, min(left, BULK))
                if n == 0:
                    raise ConnectionError(f"peer closed the connection, {left} bytes short")
                chk.check_bulk(bbuf, n)
                left -= n
            count = 1
        chk.recv_checked(conn, rbuf, rv, count)
        conn.sendall(chk.ack(rbuf))
        phases.append(chk.end())


def serve_connrate(listener: Any, transport: str) -> dict[str, Any]:
    """Accept, check + echo one byte, close, until the client's QUIT connection."""
    buf = memoryview(bytearray(1))
    seq = nbad = 0
    first_bad = -1
    info: dict[str, Any] = {}
    c0 = cpu_seconds()
    t0 = time.perf_counter_ns()
    while True:
        conn, _ = listener.accept()
        try:
            recv_exact(conn, buf, 1)
            b = buf[0]
            conn.sendall(buf)
            if b == QUIT:
                info = transport_info(transport, conn)
                break
            if b != seq % 255:
                if not nbad:
                    first_bad = seq
                nbad += 1
            seq += 1
        finally:
            conn.close()
    t1 = time.perf_counter_ns()
    result: dict[str, Any] = {
        "ok": not nbad,
        "connections": seq,
        "ns": t1 - t0,
        "cpu_s": cpu_seconds() - c0,
        "nbad": nbad,
        **info,
    }
    if nbad:
        result["verify_error"] = (
            f"{nbad} of {seq} connections carried the wrong sequence byte; first: {first_bad}"
        )
    return result


def raise_fd_limit(need: int) -> None:
    """Make room for ``need`` more descriptors (soft limit up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def idle_window(conns: list[Any], transport: str, start_ns: int, end_ns: int) -> dict[str, Any]:
    """Wait for input on every connection (a selector, as an event-driven server
    does) from ``start_ns`` to ``end_ns`` (CLOCK_MONOTONIC, shared by both processes).

    Returns the process CPU time (all threads) spent in that window, how many
    connections reported readiness before its end (``wakeups``: should be 0, the
    peer sends nothing until the window is over) and, for rsock, the change of the
    connections' counters in the window.  A connection that wakes us is unregistered
    so that a stuck readiness cannot turn into a busy loop.
    """
    sel = selectors.DefaultSelector()
    try:
        for i, conn in enumerate(conns):  # before the window: fileno() arms rsock's fd
            sel.register(conn, selectors.EVENT_READ, i)
        now = time.monotonic_ns()
        if start_ns > now:
            time.sleep((start_ns - now) / 1e9)
        before = rsock_counters(transport, conns)
        wakeups: list[int] = []
        selects = 0
        c0 = cpu_seconds()
        t0 = time.monotonic_ns()
        while (left := end_ns - time.monotonic_ns()) > 0:
            events = sel.select(left / 1e9)
            selects += 1
            if time.monotonic_ns() >= end_ns:
                break  # what woke us came after the window (the peer's wake-up bytes)
            for key, _ in events:
                wakeups.append(int(key.data))
                sel.unregister(key.fileobj)
        t1 = time.monotonic_ns()
        c1 = cpu_seconds()
        after = rsock_counters(transport, conns)
    finally:
        sel.close()
    return {
        "idle_ns": t1 - t0,
        "idle_cpu_s": c1 - c0,
        "selects": selects,
        "wakeups": len(wakeups),
        "woken_connections": wakeups[:20],
        "idle_counters": {k: after[k] - before.get(k, 0) for k in after},
    }


def serve_idle(listener: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Accept ``--size`` connections, hold them idle for ``--idle-time`` seconds.

    The client sends ``IDLE_GO`` on its first connection when all are connected; the
    reply carries the window (start, end) in CLOCK_MONOTONIC nanoseconds, which both
    processes share.  After the window the client sends ``IDLE_WAKE`` on every
    connection and the server echoes it: every connection is still alive.
    """
    n: int = args.size
    raise_fd_limit(8 * n)
    conns: list[Any] = []
    buf = memoryview(bytearray(1))
    try:
        while len(conns) < n:
            conn, _ = listener.accept()
            conns.append(conn)
            tune(conn, args.transport)
        recv_exact(conns[0], buf, 1)
        if bytes(buf) != IDLE_GO:
            raise VerifyError(f"idle: expected the start byte {IDLE_GO!r}, got {bytes(buf)!r}")
        start = time.monotonic_ns() + IDLE_LEAD_NS
        end = start + int(args.idle_time * 1e9)
        conns[0].sendall(IDLE_WINDOW.pack(start, end))
        window = idle_window(conns, args.transport, start, end)
        for i, conn in enumerate(conns):
            recv_exact(conn, buf, 1)
            if bytes(buf) != IDLE_WAKE:
                raise VerifyError(f"idle: connection {i} carried {bytes(buf)!r} after the window")
            conn.sendall(buf)
        info = transport_info(args.transport, conns[0])
    finally:
        for conn in conns:
            conn.close()
    return {
        "ok": True,
        "connections": n,
        **window,
        **info,
    }


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


# --------------------------------------------------------------------------- asyncio server


class AsyncServer(asyncio.BufferedProtocol):
    """The server of either test as a BufferedProtocol, driven from ``buffer_updated``.

    Receives straight into the header buffer or the message buffer (exactly one unit
    at a time, like the sync ``recv_exact``) and handles each completed unit: stream
    messages go through the same :class:`StreamChecker`, pingpong messages are echoed.
    """

    def __init__(self, args: argparse.Namespace, phases: list[dict[str, Any]]) -> None:
        self.kind: str = args.transport
        self.stream = args.test not in ("pingpong", "rate")  # stream or msgrate
        self.size: int = args.size
        self.phases = phases
        self.done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.hview = memoryview(bytearray(HDR.size))
        self.rbuf = bytearray(self.size)
        self.rv = memoryview(self.rbuf)
        self.target = self.hview  # what the next bytes complete
        self.got = 0
        self.left = 0  # messages left in this phase; 0: a header comes next
        self.chk = StreamChecker(self.size)
        self.bulk = bulk_recv(args)
        self.bbuf = bytearray(BULK if self.bulk else 0)
        self.bview = memoryview(self.bbuf)
        self.bleft = 0  # bulk bytes left in this phase (all but its last message)
        if self.bulk:
            self.chk.bulk_init(BULK)
        self.count = 0
        self.c0 = 0.0
        self.t0 = 0
        self.info: dict[str, Any] = {}
        self.finished = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is not None:  # one connection per session
            cast(asyncio.Transport, transport).abort()
            return
        self.transport = cast(asyncio.Transport, transport)
        tune_transport(transport, self.kind)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.bleft:
            return self.bview[: self.bleft] if self.bleft < BULK else self.bview
        got = self.got
        return self.target[got:] if got else self.target  # no slice in the common case

    def buffer_updated(self, nbytes: int) -> None:
        if self.bleft:
            try:
                self.chk.check_bulk(self.bbuf, nbytes)
            except Exception as exc:  # noqa: BLE001 - as below
                self.fail(exc)
            self.bleft -= nbytes
            return
        got = self.got + nbytes
        if got < len(self.target):
            self.got = got
            return
        self.got = 0
        if self.left > 1 and self.stream:  # a stream message within a phase: check it
            self.left -= 1
            self.chk.check(self.rbuf, self.rv)  # counts, never raises
            return
        try:
            self.completed()
        except Exception as exc:  # noqa: BLE001 - ends the session, reported by serve()
            self.fail(exc)

    def fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        assert self.transport is not None
        self.transport.abort()

    def completed(self) -> None:
        tr = self.transport
        assert tr is not None
        if self.left == 0:
            magic, flags, count = HDR.unpack(self.hview)
            if magic != MAGIC:
                raise VerifyError(
                    f"stream out of sync: expected a phase header, got {bytes(self.hview)!r}"
                )
            if count == 0:
                self.info = transport_info(self.kind, tr.get_extra_info("socket"))
                tr.write(ACK.pack(0, 0))
                self.finished = True
                tr.close()
                return
            self.left = count
            self.target = self.rv
            if self.stream:
                self.chk.begin(flags, count)
                if self.bulk:  # all but the last message in bulk, that one as a message
                    self.bleft, self.left = (count - 1) * self.size, 1
            else:
                self.count = count
                self.c0 = cpu_seconds()
                self.t0 = time.perf_counter_ns()
            return
        if self.stream:
            self.chk.check(self.rbuf, self.rv)
        else:
            tr.write(bytes(self.rv))
        self.left -= 1
        if self.left == 0:
            self.target = self.hview
            if self.stream:
                tr.write(self.chk.ack(self.rbuf))
                self.phases.append(self.chk.end())
            else:
                t1 = time.perf_counter_ns()
                self.phases.append(
                    {"count": self.count, "ns": t1 - self.t0, "cpu_s": cpu_seconds() - self.c0}
                )

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if self.finished:
            self.done.set_result(self.info)
        else:
            where = f"{len(self.phases)} phase(s) done, {self.left} message(s) left in this one"
            self.done.set_exception(exc or ConnectionError(f"peer closed the connection: {where}"))


async def astart_server(
    args: argparse.Namespace, factory: Callable[[], asyncio.BaseProtocol], backlog: int
) -> Any:
    """The server of the transport (the loop's own for tcp/unix, rsock.asyncio's
    for rsock) on the running loop; prints READY with its address."""
    loop = asyncio.get_running_loop()
    server: Any
    if args.transport == "rsock":
        server = await rsock_asyncio().create_server(factory, "127.0.0.1", 0, backlog=backlog)
        addr = str(server.sockets[0].getsockname()[1])
    elif args.transport == "unix":
        server = await loop.create_unix_server(factory, args.addr, backlog=backlog)
        addr = args.addr
    else:
        server = await loop.create_server(factory, "127.0.0.1", 0, backlog=backlog)
        addr = str(server.sockets[0].getsockname()[1])
    print(f"READY {addr}", flush=True)
    return server


async def aserve(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    phases: list[dict[str, Any]] = []
    protos: list[AsyncServer] = []
    connected: asyncio.Future[None] = loop.create_future()

    def factory() -> AsyncServer:
        protos.append(AsyncServer(args, phases))
        if not connected.done():
            connected.set_result(None)
        return protos[-1]

    server = await astart_server(args, factory, 1)
    try:
        await connected
        server.close()  # like the sync server: one connection, then no listener
        info = await protos[0].done
    except Exception:
        if any(p.get("nbad") for p in phases):  # report the corruption, not its aftermath
            raise VerifyError(server_verify_error(phases)) from None
        raise
    finally:
        server.close()
        for p in protos:
            if p.transport is not None:
                p.transport.abort()
    return server_result(phases, {**info, **api_info(args)})


class ConnrateServer(asyncio.Protocol):
    """One connection of the asyncio connrate server: check and echo its
    byte, then close (as ``serve_connrate``)."""

    def __init__(self, state: dict[str, Any], done: asyncio.Future[dict[str, Any]]) -> None:
        self.state = state
        self.done = done
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        tr = self.transport
        assert tr is not None
        st = self.state
        b = data[0]
        tr.write(data[:1])
        tr.close()
        if b == QUIT or len(data) != 1:
            if len(data) != 1:
                st["nbad"] += 1
            if not self.done.done():
                self.done.set_result(transport_info(st["kind"], tr.get_extra_info("socket")))
            return
        if b != st["seq"] % 255:
            if not st["nbad"]:
                st["first_bad"] = st["seq"]
            st["nbad"] += 1
        st["seq"] += 1


async def aserve_connrate(args: argparse.Namespace) -> dict[str, Any]:
    """``serve_connrate`` on an event loop: the server's Protocol echoes
    each connection's byte and closes, until the client's QUIT."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[dict[str, Any]] = loop.create_future()
    st: dict[str, Any] = {"kind": args.transport, "seq": 0, "nbad": 0, "first_bad": -1}

    def factory() -> ConnrateServer:
        return ConnrateServer(st, done)

    server = await astart_server(args, factory, 128)
    c0 = cpu_seconds()
    t0 = time.perf_counter_ns()
    try:
        info = await done
    finally:
        server.close()
    t1 = time.perf_counter_ns()
    result: dict[str, Any] = {
        "ok": not st["nbad"],
        "connections": st["seq"],
        "ns": t1 - t0,
        "cpu_s": cpu_seconds() - c0,
        "nbad": st["nbad"],
        **info,
        **api_info(args),
    }
    if st["nbad"]:
        result["verify_error"] = (
            f"{st['nbad']} of {st['seq']} connections carried the wrong sequence byte; "
            f"first: {st['first_bad']}"
        )
    return result


# --------------------------------------------------------------------------- client


def connect(args: argparse.Namespace, nodelay: bool = True) -> Any:
    sock = new_socket(args.transport)
    try:
        if args.transport == "unix":
            sock.connect(args.addr)
        else:
            sock.connect(("127.0.0.1", int(args.addr)))
        if nodelay:
            tune(sock, args.transport)
    except BaseException:
        sock.close()
        raise
    return sock


def end_session(conn: StreamSocket) -> None:
    conn.sendall(HDR.pack(MAGIC, 0, 0))
    abuf = memoryview(bytearray(ACK.size))
    recv_exact(conn, abuf, ACK.size)


class StreamClient:
    """Client side of the stream test; ``phase`` is the sync one, ``aphase`` asyncio's."""

    def __init__(self, size: int, fault: str) -> None:
        self.size = size
        self.fault = fault
        self.pat = pattern(size)
        self.wins = windows(self.pat, size)
        self.crcs = [zlib.crc32(w) for w in self.wins]
        self.abuf = memoryview(bytearray(ACK.size))
        self.seq = 0

    def bad_index(self, count: int, kind: str) -> int:
        """Which message of the phase --fault corrupts (-1: none)."""
        if self.fault == "flip" or (self.fault == "stale" and kind == "rep"):
            return count // 2
        return -1

    def phase(self, conn: StreamSocket, count: int, full: bool, kind: str) -> dict[str, Any]:
        wins, seq0 = self.wins, self.seq
        bad_at = self.bad_index(count, kind)
        c0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        conn.sendall(HDR.pack(MAGIC, FLAG_FULL_VERIFY if full else 0, count))
        if bad_at < 0:
            sendall = conn.sendall
            for k in range(seq0, seq0 + count):
                sendall(wins[k % NWIN])
        else:
            for i in range(count):
                w = wins[(seq0 + i) % NWIN]
                if i == bad_at:
                    w = self.faulty(w, seq0 + i)
                conn.sendall(w)
        recv_exact(conn, self.abuf, ACK.size)
        t1 = time.perf_counter_ns()
        c1 = cpu_seconds()
        return self.finish(kind, count, t1 - t0, c1 - c0, self.abuf)

    async def aphase(self, proto: AsyncClient, count: int, full: bool, kind: str) -> dict[str, Any]:
        """``phase`` over an asyncio transport: writes with flow control."""
        tr = proto.transport
        assert tr is not None
        write = tr.write
        wins, seq0 = self.wins, self.seq
        bad_at = self.bad_index(count, kind)
        c0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        write(HDR.pack(MAGIC, FLAG_FULL_VERIFY if full else 0, count))
        if bad_at < 0:  # the timed loop: nothing but the writes and flow control
            for k in range(seq0, seq0 + count):
                write(wins[k % NWIN])
                if proto.resume is not None:  # paused: wait for resume_writing()
                    await proto.resume
                    proto.check_lost()
        else:
            for i in range(count):
                w = wins[(seq0 + i) % NWIN]
                if i == bad_at:
                    w = self.faulty(w, seq0 + i)
                write(w)
                if proto.resume is not None:
                    await proto.resume
                    proto.check_lost()
        ack = await proto.read_exact(ACK.size)
        t1 = time.perf_counter_ns()
        c1 = cpu_seconds()
        return self.finish(kind, count, t1 - t0, c1 - c0, ack)

    def finish(
        self, kind: str, count: int, ns: int, cpu_s: float, ack: memoryview
    ) -> dict[str, Any]:
        """Account a phase and check the server's ack."""
        self.seq += count
        nbad, crc = ACK.unpack(ack)
        expected_crc = self.crcs[(self.seq - 1) % NWIN]
        result = {
            "kind": kind,
            "count": count,
            "bytes": count * self.size,
            "ns": ns,
            "cpu_s": cpu_s,
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


def next_stream_phase(
    args: argparse.Namespace, phases: list[dict[str, Any]]
) -> tuple[str, int, bool] | None:
    """(kind, message count, full verify) of the next stream phase, None when done.

    One fully verified warm-up of ``--warmup-bytes``, one calibration phase of about
    min(0.2, rep_time / 2) s, then ``--reps`` phases of one count sized from it.
    """
    size: int = args.size
    full = args.verify == "full"
    n = len(phases)
    if n == 0:
        return "warmup", max(4, -(-int(args.warmup_bytes) // size)), True
    if n >= 2 + args.reps:
        return None
    if n > 2:
        return "rep", int(phases[-1]["count"]), full
    rate = phases[-1]["bytes"] / max(phases[-1]["ns"], 1) * 1e9  # bytes/s
    if n == 1:
        return "calibrate", max(4, int(rate * min(0.2, args.rep_time / 2) / size)), full
    return "rep", min(max(4, round(rate * args.rep_time / size)), 10**8), full


class Gate:
    """Turns between the transports of one interleaved group (``--gate R,W``):
    before each phase the client waits for the orchestrator's go byte on fd R,
    after it says done with a byte on fd W, so the phases of rsock and TCP
    alternate in time and share whatever the machine does meanwhile.  Without
    ``--gate`` both calls do nothing."""

    def __init__(self, spec: str) -> None:
        self.rfd = self.wfd = -1
        if spec:
            r, w = spec.split(",")
            self.rfd, self.wfd = int(r), int(w)

    def wait(self) -> None:
        if self.rfd >= 0 and not os.read(self.rfd, 1):
            raise ConnectionError("bench gate: the orchestrator went away")

    def done(self) -> None:
        if self.wfd >= 0:
            os.write(self.wfd, b"d")


def client_stream(conn: StreamSocket, args: argparse.Namespace) -> dict[str, Any]:
    cl = StreamClient(args.size, args.fault)
    gate = Gate(args.gate)
    phases: list[dict[str, Any]] = []
    while (nxt := next_stream_phase(args, phases)) is not None:
        kind, count, full = nxt
        gate.wait()
        m0 = time.monotonic_ns()
        phases.append(cl.phase(conn, count, full, kind))
        phases[-1]["mono_ns"] = [m0, time.monotonic_ns()]  # when, on the shared clock
        gate.done()
    end_session(conn)
    return {"ok": True, "phases": phases}


class PhaseClock:
    """One timed phase of a connrate client: ``tick()`` after each connection
    says whether the phase's time is up; ``result()`` is its record."""

    def __init__(self, kind: str, secs: float) -> None:
        self.kind = kind
        self.count = 0
        self.c0 = cpu_seconds()
        self.t0 = self.t1 = time.perf_counter_ns()
        self.end = self.t0 + int(secs * 1e9)

    def tick(self) -> bool:
        self.count += 1
        self.t1 = time.perf_counter_ns()
        return self.t1 >= self.end

    def result(self) -> dict[str, Any]:
        ns = self.t1 - self.t0
        return {"kind": self.kind, "count": self.count, "ns": ns, "cpu_s": cpu_seconds() - self.c0}


def timed_phases(args: argparse.Namespace) -> Iterator[PhaseClock]:
    """The connrate client's phases: a warm-up of min(0.2, --rep-time / 2) s,
    then --reps of --rep-time s, each clock started as it is handed out."""
    yield PhaseClock("warmup", min(0.2, args.rep_time / 2))
    for _ in range(args.reps):
        yield PhaseClock("rep", args.rep_time)


def client_connrate(args: argparse.Namespace) -> dict[str, Any]:
    """connect + 1-byte echo + close in a loop: a warm-up, then --reps timed phases.

    Each phase runs for a fixed time (warm-up: min(0.2, rep_time / 2) s, reps:
    --rep-time) and reports how many connections it completed.
    """
    buf = memoryview(bytearray(2))
    seq = 0
    info: dict[str, Any] = {}

    def one(b: int) -> None:
        sock = connect(args, nodelay=False)
        try:
            sock.sendall(bytes((b,)))
            recv_exact(sock, buf, 1)
            if buf[0] != b:
                raise VerifyError(f"connection {seq}: echo {buf[0]} of byte {b}")
            if sock.recv_into(buf, 2) != 0:  # wait for the server's close
                raise VerifyError(f"connection {seq}: unexpected data after the echo")
            if not info:
                info.update(transport_info(args.transport, sock))
        finally:
            sock.close()

    if args.fault == "hang":
        time.sleep(10**6)
    phases: list[dict[str, Any]] = []
    for clock in timed_phases(args):
        while True:
            one(seq % 255)
            seq += 1
            if clock.tick():
                break
        phases.append(clock.result())
    one(QUIT)
    return {"ok": True, "phases": phases, "connections": seq, **info}


def client_idle(args: argparse.Namespace) -> dict[str, Any]:
    """The client of ``serve_idle``: connect ``--size`` times, idle, wake every one."""
    n: int = args.size
    raise_fd_limit(8 * n)
    conns: list[Any] = []
    buf = memoryview(bytearray(1))
    wbuf = memoryview(bytearray(IDLE_WINDOW.size))
    try:
        c0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            conns.append(connect(args))
        setup_ns = time.perf_counter_ns() - t0
        setup_cpu = cpu_seconds() - c0
        if args.fault == "hang":
            time.sleep(10**6)
        conns[0].sendall(IDLE_GO)
        recv_exact(conns[0], wbuf, IDLE_WINDOW.size)
        start, end = IDLE_WINDOW.unpack(wbuf)
        window = idle_window(conns, args.transport, start, end)
        # wake the server only once it has surely closed its window: its
        # counters must not see our wake-up bytes (an rsock process takes in
        # arrivals in the background, through the watcher of fileno())
        late = end + IDLE_LEAD_NS - time.monotonic_ns()
        if late > 0:
            time.sleep(late / 1e9)
        for conn in conns:
            conn.sendall(IDLE_WAKE)
        for i, conn in enumerate(conns):
            recv_exact(conn, buf, 1)
            if bytes(buf) != IDLE_WAKE:
                raise VerifyError(f"idle: connection {i} echoed {bytes(buf)!r}")
        info = transport_info(args.transport, conns[0])
    finally:
        for conn in conns:
            conn.close()
    return {
        "ok": True,
        "connections": n,
        "setup_ns": setup_ns,
        "setup_cpu_s": setup_cpu,
        **window,
        **info,
    }


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


class RateLog:
    """The rate client's record of its phases (``_rate.phase_plan``): each phase
    with its place on the shared clock, the samples of the timed ones."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.rate: float = args.rate
        self.period = _rate.period_ns(args.rate)
        self.plan = _rate.phase_plan(args.rate, args.rate_time)
        self.phases: list[dict[str, Any]] = []
        self.lat = array("q")
        self.lag = array("q")
        self.seq = 0  # sequence number of the next message (over the session)

    def add(self, m0: int, phase: dict[str, Any], sender: Any, replies: Any) -> None:
        phase["mono_ns"] = [m0, time.monotonic_ns()]
        self.phases.append(phase)
        self.seq += phase["count"]
        if phase["nbad"]:
            raise VerifyError(
                f"rate {phase['kind']}: {phase['nbad']} of {phase['count']} echoes differ from "
                f"their request; first: message {phase['first_bad_seq']}"
            )
        if phase["kind"] == "rep":
            self.lat.extend(replies.lat)
            self.lag.extend(sender.lag)

    def result(self) -> dict[str, Any]:
        return {
            "ok": True,
            "phases": self.phases,
            "rate_asked": self.rate,
            "rate_target": 1e9 / self.period,
            "period_ns": self.period,
            "lat_ns": self.lat.tolist(),  # reply arrival - scheduled send, timed phases
            "lag_ns": self.lag.tolist(),  # sender wake-up - scheduled send, timed phases
        }


def client_rate(conn: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Fixed-rate requests on a blocking socket: a sending and a receiving thread."""
    log = RateLog(args)
    gate = Gate(args.gate)
    for kind, count in log.plan:
        gate.wait()
        m0 = time.monotonic_ns()
        conn.sendall(HDR.pack(MAGIC, 0, count))
        log.add(m0, *_rate.run_phase_sync(conn, kind, count, log.seq, log.period))
        gate.done()
    end_session(conn)
    return log.result()


# --------------------------------------------------------------------------- asyncio client


class AsyncClient(asyncio.BufferedProtocol):
    """Client transport state: one awaited response at a time, write flow control."""

    def __init__(self, kind: str, capacity: int) -> None:
        self.kind = kind
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.view = memoryview(bytearray(capacity + 65536))  # room to detect extra bytes
        self.got = 0
        self.need = 0
        self.waiter: asyncio.Future[None] | None = None
        self.resume: asyncio.Future[None] | None = None  # set while writing is paused
        self.lost: Exception | None = None
        self.closed: asyncio.Future[None] = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        tune_transport(transport, self.kind)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.got :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        w = self.waiter
        if w is not None and self.got >= self.need and not w.done():
            w.set_result(None)

    async def read_exact(self, n: int) -> memoryview:
        """The next ``n`` bytes (a view valid until the next request is sent)."""
        if self.got < n:
            self.check_lost()
            self.need = n
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
            if self.got < n:
                self.check_lost()
        if self.got != n:
            raise VerifyError(f"expected a {n}-byte response, received {self.got} bytes")
        self.got = 0
        return self.view[:n]

    def check_lost(self) -> None:
        if self.lost is not None:
            raise self.lost

    def pause_writing(self) -> None:
        if self.resume is None:
            self.resume = self.loop.create_future()

    def resume_writing(self) -> None:
        fut, self.resume = self.resume, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionError("server closed the connection")
        for fut in (self.waiter, self.resume, self.closed):
            if fut is not None and not fut.done():
                fut.set_result(None)


async def aclient_stream(proto: AsyncClient, args: argparse.Namespace) -> dict[str, Any]:
    cl = StreamClient(args.size, args.fault)
    gate = Gate(args.gate)
    phases: list[dict[str, Any]] = []
    while (nxt := next_stream_phase(args, phases)) is not None:
        kind, count, full = nxt
        gate.wait()  # blocks the loop: nothing of this session is in flight between phases
        m0 = time.monotonic_ns()
        phases.append(await cl.aphase(proto, count, full, kind))
        phases[-1]["mono_ns"] = [m0, time.monotonic_ns()]
        gate.done()
    await aend_session(proto)
    return {"ok": True, "phases": phases}


async def aclient_pingpong(proto: AsyncClient, args: argparse.Namespace) -> dict[str, Any]:
    size: int = args.size
    wins = windows(pattern(size), size)
    tr = proto.transport
    assert tr is not None
    write, read_exact = tr.write, proto.read_exact
    phases: list[dict[str, Any]] = []
    samples = array("q")
    seq = 0
    for kind, count in (("warmup", args.warmup_rounds), ("rep", args.rounds)):
        if count <= 0:
            continue
        samples = array("q", bytes(8 * count))
        write(HDR.pack(MAGIC, 0, count))
        nbad = 0
        c0 = cpu_seconds()
        w0 = time.perf_counter_ns()
        for i in range(count):
            msg = wins[seq % NWIN]
            t0 = time.perf_counter_ns()
            write(msg)
            got = await read_exact(size)
            t1 = time.perf_counter_ns()
            samples[i] = t1 - t0
            if got != msg:
                nbad += 1
            seq += 1
        w1 = time.perf_counter_ns()
        c1 = cpu_seconds()
        phases.append({"kind": kind, "count": count, "ns": w1 - w0, "cpu_s": c1 - c0})
        if nbad:
            raise VerifyError(f"ping-pong {kind}: {nbad} of {count} echoes differ from the message")
    await aend_session(proto)
    return {"ok": True, "phases": phases, "rtt_ns": samples.tolist()}


async def aclient_rate(proto: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Fixed-rate requests on an event loop (``_rate.RateClient``)."""
    log = RateLog(args)
    gate = Gate(args.gate)
    tr = proto.transport
    for kind, count in log.plan:
        gate.wait()  # blocks the loop: nothing of this session is in flight between phases
        m0 = time.monotonic_ns()
        tr.write(HDR.pack(MAGIC, 0, count))
        log.add(m0, *await _rate.run_phase_async(proto, kind, count, log.seq, log.period))
        gate.done()
    tr.write(HDR.pack(MAGIC, 0, 0))
    await proto.read_raw(ACK.size)
    return log.result()


async def aend_session(proto: AsyncClient) -> None:
    assert proto.transport is not None
    proto.transport.write(HDR.pack(MAGIC, 0, 0))
    await proto.read_exact(ACK.size)


class ConnrateClient(asyncio.Protocol):
    """One connection of the asyncio connrate client: send the byte, take
    its echo, then the server's close."""

    def __init__(self, b: int, closed: asyncio.Future[bytes]) -> None:
        self.b = b
        self.got = b""
        self.closed = closed
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(bytes((self.b,)))

    def data_received(self, data: bytes) -> None:
        self.got += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            if exc is not None:
                self.closed.set_exception(exc)
            else:
                self.closed.set_result(self.got)


async def aclient_connrate(args: argparse.Namespace) -> dict[str, Any]:
    """``client_connrate`` on an event loop: create_connection + 1-byte
    echo + the server's close, in a loop (warm-up, then --reps phases)."""
    loop = asyncio.get_running_loop()
    info: dict[str, Any] = {}
    seq = 0
    if args.transport == "rsock":
        create = rsock_asyncio().create_connection
    elif args.transport != "unix":
        create = loop.create_connection

    async def one(b: int) -> None:
        closed: asyncio.Future[bytes] = loop.create_future()

        def factory() -> ConnrateClient:
            return ConnrateClient(b, closed)

        if args.transport == "unix":
            tr, _ = await loop.create_unix_connection(factory, args.addr)
        else:
            tr, _ = await create(factory, "127.0.0.1", int(args.addr))
        try:
            if not info:
                info.update(transport_info(args.transport, tr.get_extra_info("socket")))
            got = await asyncio.wait_for(closed, 10.0)
        finally:
            tr.abort()  # (closed already: a no-op)
        if got != bytes((b,)):
            raise VerifyError(f"connection {seq}: echo {got!r} of byte {b}")

    if args.fault == "hang":
        await asyncio.sleep(10**6)
    phases: list[dict[str, Any]] = []
    for clock in timed_phases(args):
        while True:
            await one(seq % 255)
            seq += 1
            if clock.tick():
                break
        phases.append(clock.result())
    await one(QUIT)
    return {"ok": True, "phases": phases, "connections": seq, **info, **api_info(args)}


async def aclient(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    cap = args.size if args.test == "pingpong" else ACK.size
    if args.test in SYNC_ONLY:
        raise ValueError(f"{args.test} runs with the sync api only")
    if args.test == "connrate":
        return await aclient_connrate(args)

    def factory() -> asyncio.BaseProtocol:
        if args.test == "rate":
            return _rate.RateClient()
        return AsyncClient(args.transport, cap)

    proto: Any  # AsyncClient, or _rate.RateClient for the rate test
    if args.transport == "rsock":
        _, proto = await rsock_asyncio().create_connection(factory, "127.0.0.1", int(args.addr))
    elif args.transport == "unix":
        _, proto = await loop.create_unix_connection(factory, args.addr)
    else:
        _, proto = await loop.create_connection(factory, "127.0.0.1", int(args.addr))
    tr = proto.transport
    assert tr is not None
    try:
        if args.fault == "hang":
            await asyncio.sleep(10**6)
        if args.test == "rate":
            tune_transport(tr, args.transport)
            result = await aclient_rate(proto, args)
        elif args.test in ("stream", "msgrate"):
            result = await aclient_stream(proto, args)
        else:
            result = await aclient_pingpong(proto, args)
        result.update(transport_info(args.transport, tr.get_extra_info("socket")))
        result.update(api_info(args))
        tr.close()
        await asyncio.wait_for(proto.closed, 10.0)
    finally:
        if not proto.closed.done():
            tr.abort()
    return result


# --------------------------------------------------------------------------- ucxx


def ucxx_module() -> Any:
    return importlib.import_module("ucxx")


def ucxx_info(mod: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"provider": "ucx", "ucxx_version": getattr(mod, "__version__", None)}
    try:
        info["ucx_version"] = ".".join(map(str, mod.get_ucx_version()))
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        info["ucx_version_error"] = repr(exc)
    return info


async def userve(args: argparse.Namespace) -> dict[str, Any]:
    """Ping-pong echo server over UCXX (tag send/recv of whole messages).

    Same protocol as the other transports, message by message: a phase header
    (``HDR.size`` bytes), ``count`` echoed messages, a header of count 0 answered
    with an ``ACK``; then one ``b"B"`` from the client before both sides close.
    """
    if args.test != "pingpong":
        raise ValueError("the ucxx transport runs the pingpong test only")
    ucxx = ucxx_module()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    phases: list[dict[str, Any]] = []
    size: int = args.size

    async def handler(ep: Any) -> None:
        try:
            hbuf = bytearray(HDR.size)
            buf = bytearray(size)
            while True:
                await ep.recv(hbuf)
                magic, _, count = HDR.unpack(hbuf)
                if magic != MAGIC:
                    raise VerifyError(f"ucxx: expected a phase header, got {bytes(hbuf)!r}")
                if count == 0:
                    await ep.send(bytearray(ACK.pack(0, 0)))
                    await ep.recv(bytearray(1))
                    break
                c0 = cpu_seconds()
                t0 = time.perf_counter_ns()
                for _ in range(count):
                    await ep.recv(buf)
                    await ep.send(buf)
                t1 = time.perf_counter_ns()
                phases.append({"count": count, "ns": t1 - t0, "cpu_s": cpu_seconds() - c0})
            await ep.close()
            if not done.done():
                done.set_result(None)
        except Exception as exc:  # noqa: BLE001 - reported by userve
            if not done.done():
                done.set_exception(exc)

    listener = ucxx.create_listener(handler, 0)
    print(f"READY {listener.port}", flush=True)
    try:
        await done
    finally:
        listener.close()
    return server_result(phases, {**ucxx_info(ucxx), **api_info(args)})


async def uclient(args: argparse.Namespace) -> dict[str, Any]:
    """Ping-pong client over UCXX: see ``userve``."""
    if args.test != "pingpong":
        raise ValueError("the ucxx transport runs the pingpong test only")
    ucxx = ucxx_module()
    size: int = args.size
    wins = windows(pattern(size), size)
    ep = await ucxx.create_endpoint("127.0.0.1", int(args.addr))
    sbuf = bytearray(size)
    rbuf = bytearray(size)
    phases: list[dict[str, Any]] = []
    samples = array("q")
    seq = 0
    if args.fault == "hang":
        await asyncio.sleep(10**6)
    for kind, count in (("warmup", args.warmup_rounds), ("rep", args.rounds)):
        if count <= 0:
            continue
        samples = array("q", bytes(8 * count))
        await ep.send(bytearray(HDR.pack(MAGIC, 0, count)))
        nbad = 0
        c0 = cpu_seconds()
        w0 = time.perf_counter_ns()
        for i in range(count):
            sbuf[:] = wins[seq % NWIN]
            t0 = time.perf_counter_ns()
            await ep.send(sbuf)
            await ep.recv(rbuf)
            t1 = time.perf_counter_ns()
            samples[i] = t1 - t0
            if rbuf != sbuf:
                nbad += 1
            seq += 1
        w1 = time.perf_counter_ns()
        phases.append({"kind": kind, "count": count, "ns": w1 - w0, "cpu_s": cpu_seconds() - c0})
        if nbad:
            raise VerifyError(f"ping-pong {kind}: {nbad} of {count} echoes differ from the message")
    await ep.send(bytearray(HDR.pack(MAGIC, 0, 0)))
    await ep.recv(bytearray(ACK.size))
    await ep.send(bytearray(b"B"))
    await ep.close()
    return {"ok": True, "phases": phases, "rtt_ns": samples.tolist(), **ucxx_info(ucxx)}


def client(args: argparse.Namespace) -> dict[str, Any]:
    if args.transport == "ucxx":
        return {**run_async(args, uclient), "api": "asyncio", "loop": args.loop}
    if args.api == "asyncio":
        return run_async(args, aclient)
    if args.test == "connrate":
        return {**client_connrate(args), "api": "sync"}
    if args.test == "idle":
        return {**client_idle(args), "api": "sync"}
    conn = connect(args)
    try:
        if args.fault == "hang":
            time.sleep(10**6)
        if args.test in ("stream", "msgrate"):
            result = client_stream(conn, args)
        elif args.test == "rate":
            result = client_rate(conn, args)
        else:
            result = client_pingpong(conn, args)
        result.update(transport_info(args.transport, conn))
        result["api"] = "sync"
    finally:
        conn.close()
    return result


# --------------------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rsock.bench worker")
    ap.add_argument("role", choices=("serve", "client"))
    ap.add_argument("--transport", required=True, choices=("rsock", "tcp", "unix", "ucxx"))
    ap.add_argument(
        "--test",
        required=True,
        choices=("stream", "msgrate", "pingpong", "connrate", "idle", "rate"),
    )
    ap.add_argument("--idle-time", type=float, default=2.0)
    ap.add_argument("--api", choices=("sync", "asyncio"), default="sync")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
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
    ap.add_argument("--msgrate-recv", choices=("bulk", "message"), default="bulk")
    ap.add_argument("--gate", default="", help="R,W: fds of an interleaved group (Gate)")
    ap.add_argument("--rate", type=float, default=1000.0, help="rate: messages per second")
    ap.add_argument("--rate-time", type=float, default=2.0, help="rate: timed seconds")
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
