"""The fixed-rate (open-loop) test of ``python -m rsock.bench``: ``--tests rate``.

The client sends ``SIZE``-byte requests on a fixed schedule, the server echoes them (the
ping-pong server, unchanged), and each reply's latency is taken from the time its
request was *scheduled*, not from when it went out: message ``i`` of a phase is due at
``start + i * period`` (``period = round(10**9 / rate)`` ns), whatever happened to the
earlier ones.  A client that falls behind (a late reply, a sender that woke late, a
full send buffer) sends what is due as soon as it can, and the backlog shows up as
latency (wrk2's method: no coordinated omission).

Both sides of the schedule are driven by a periodic ``timerfd`` on CLOCK_MONOTONIC
(armed at the absolute start time; each read says how many periods have passed), the
clock of ``time.monotonic_ns``, in which every timestamp is taken:

* sync api: the main thread blocks reading the timer and ``sendall``s whatever is due;
  a second thread blocks in ``recv_into`` and timestamps every echo as it arrives.
* asyncio api: the timer is a reader of the event loop (``add_reader``), which writes
  whatever is due on the transport; the client is a ``BufferedProtocol`` that
  timestamps the echoes in ``buffer_updated``.  (``call_at`` would fire on the loop's
  millisecond clock: up to a millisecond late, which would swamp what is measured.)

Each request carries its sequence number (8 bytes, little-endian, counted over the
session) followed by a window of the pattern; every echo is checked against both.

This module is imported by the bench driver (the arithmetic) and by ``_worker.py`` (the
client's loops), started by path: standard library only, no ``rsock``.
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import random
import resource
import struct
import threading
import time
from array import array
from collections.abc import Iterable
from typing import Any, Protocol, cast

SIZE = 64  # bytes of a request (and of its echo)
SEQ = struct.Struct("<Q")  # the sequence number at the start of every request
NWIN = 61  # distinct pattern windows after the sequence number
PATTERN_SEED = 0x52415445  # "RATE"
LEAD_NS = 1_000_000  # the first message of a phase is due this long after the timer is armed
WARMUP_S = 0.25  # warm-up phase at the same rate: min(WARMUP_S, duration / 4) ...
WARMUP_MIN = 20  # ... and at least this many messages
SLICES = 2  # the timed duration of a point is cut into this many phases (turns)
RECV_BUF = 65536  # bytes asked for per receive

# the default sweep: fixed rates (messages/s) and fractions of TCP's closed-loop maximum
DEFAULT_RATES = (200.0, 2000.0, 20000.0)
DEFAULT_FRACS = (0.1, 0.5, 0.9)


# --------------------------------------------------------------------------- arithmetic


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of an ascending list."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = math.ceil(p * len(sorted_values) / 100 - 1e-9)
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def spread(sorted_values: list[float], prefix: str) -> dict[str, float]:
    """``<prefix>_p50``, ``_p90``, ``_p99``, ``_p99_9``, ``_min``, ``_max`` and
    ``_mean`` of an ascending list (latencies, round trips)."""
    out = {f"{prefix}_p{str(p).replace('.', '_')}": percentile(sorted_values, p)
           for p in (50, 90, 99, 99.9)}  # fmt: skip
    out[f"{prefix}_min"] = sorted_values[0]
    out[f"{prefix}_max"] = sorted_values[-1]
    out[f"{prefix}_mean"] = sum(sorted_values) / len(sorted_values)
    return out


def period_ns(rate: float) -> int:
    """The schedule's period in whole nanoseconds for ``rate`` messages/s."""
    if not rate > 0:
        raise ValueError(f"rate must be positive: {rate!r}")
    return max(1, round(1e9 / rate))


def frac_rates(max_rate: float, fracs: Iterable[float]) -> list[float]:
    """The target rates that are ``fracs`` of a closed-loop maximum rate."""
    if not max_rate > 0:
        raise ValueError(f"no closed-loop maximum to take fractions of: {max_rate!r}")
    return [max_rate * f for f in fracs]


def closed_loop_rate(client: dict[str, Any]) -> float:
    """Round trips/s of a ping-pong client's timed phase (one request in flight):
    the closed-loop maximum that ``--rate-frac`` takes fractions of."""
    rep = [p for p in client["phases"] if p["kind"] == "rep"][-1]
    return float(rep["count"] / rep["ns"] * 1e9)


def phase_plan(rate: float, duration: float) -> list[tuple[str, int]]:
    """(kind, messages) of a point's phases: a warm-up at the same rate, then
    ``duration`` seconds in ``SLICES`` timed phases."""
    per_s = 1e9 / period_ns(rate)
    warm = max(WARMUP_MIN, round(per_s * min(WARMUP_S, duration / 4)))
    rep = max(2, round(per_s * duration / SLICES))
    return [("warmup", warm), *[("rep", rep)] * SLICES]


def cpu_us_per_msg(cpu_s: float, messages: int) -> float:
    """CPU microseconds per message (user+sys of a process over a window)."""
    return cpu_s / messages * 1e6 if messages else 0.0


class Schedule:
    """Message ``i`` of a phase is due at ``start + i * period`` (CLOCK_MONOTONIC ns)."""

    def __init__(self, start_ns: int, period: int) -> None:
        self.start = start_ns
        self.period = period

    def at(self, i: int) -> int:
        return self.start + i * self.period


class Sender:
    """Which messages a timer expiry makes due: the ``k`` expirations since the
    last read (a timerfd's count) add ``k`` to the messages due; everything due
    and not sent yet goes now, each at its own scheduled time.  ``lag[i]``: how
    late the sender woke for message ``i`` (now - its scheduled time)."""

    def __init__(self, sched: Schedule, count: int) -> None:
        self.sched = sched
        self.count = count
        self.fired = 0
        self.sent = 0
        self.lag = array("q", bytes(8 * count))

    def due(self, expirations: int, now_ns: int) -> range:
        self.fired += expirations
        todo = range(self.sent, min(self.fired, self.count))
        at, lag = self.sched.at, self.lag
        for i in todo:
            lag[i] = now_ns - at(i)
        self.sent = todo.stop
        return todo

    @property
    def done(self) -> bool:
        return self.sent >= self.count


def pattern_tails() -> list[bytes]:
    """What follows the sequence number in a request, by ``seq % NWIN``."""
    pat = random.Random(PATTERN_SEED).randbytes(SIZE + NWIN)
    return [pat[w : w + SIZE - SEQ.size] for w in range(NWIN)]


TAILS = pattern_tails()


def message(seq: int) -> bytes:
    return SEQ.pack(seq) + TAILS[seq % NWIN]


class Replies:
    """The receiving side of one phase: the echoed bytes as they arrive, cut into
    messages; each is checked (its sequence number is the next expected one, its
    pattern is intact) and its latency stored: arrival - scheduled send time.

    ``space()`` is where the next bytes go (never more than the phase still
    owes), ``take(n, t)`` accounts ``n`` bytes that arrived at ``t``."""

    def __init__(self, sched: Schedule, count: int, seq0: int) -> None:
        self.sched = sched
        self.count = count
        self.seq0 = seq0
        self.buf = bytearray(RECV_BUF)
        self.view = memoryview(self.buf)
        self.have = 0  # bytes of an incomplete message at the start of buf
        self.got = 0
        self.nbad = 0
        self.first_bad = -1
        self.lat = array("q", bytes(8 * count))
        self.t_first = self.t_last = 0

    def space(self) -> memoryview:
        owed = (self.count - self.got) * SIZE - self.have
        return self.view[self.have : self.have + min(owed, RECV_BUF - self.have)]

    def take(self, n: int, t_ns: int) -> None:
        total = self.have + n
        k = total // SIZE
        buf, lat, at = self.buf, self.lat, self.sched.at
        seq0, got = self.seq0, self.got
        for off in range(0, k * SIZE, SIZE):
            seq = SEQ.unpack_from(buf, off)[0]
            if seq != seq0 + got or not buf.startswith(TAILS[seq % NWIN], off + SEQ.size):
                if self.first_bad < 0:
                    self.first_bad = seq0 + got
                self.nbad += 1
            lat[got] = t_ns - at(got)
            got += 1
        if k and not self.got:
            self.t_first = t_ns
        if k:
            self.t_last = t_ns
        self.got = got
        rest = total - k * SIZE
        if rest and k:
            buf[:rest] = buf[k * SIZE : total]
        self.have = rest

    @property
    def done(self) -> bool:
        return self.got >= self.count


def summarize(client: dict[str, Any], server: dict[str, Any]) -> dict[str, Any]:
    """A point's figures from both workers' results (timed phases only):

    achieved rate = replies / time between the first and the last reply of each
    phase (summed over the phases; the schedule's rate when the transport keeps
    up), latency percentiles from the scheduled send times (µs), CPU per message
    of each side = its user+sys over its timed windows / messages."""
    cph, sph = client["phases"], server["phases"]
    if len(cph) != len(sph):
        raise ValueError(f"client ran {len(cph)} phases, server {len(sph)}")
    reps = [(c, s) for c, s in zip(cph, sph, strict=True) if c["kind"] == "rep"]
    if not reps:
        raise ValueError("no timed phase")
    for c, s in reps:
        if c["count"] != s["count"]:
            raise ValueError(f"client sent {c['count']} messages, server echoed {s['count']}")
    count = sum(c["count"] for c, _ in reps)
    spans = sum(c["reply_span_ns"] for c, _ in reps)
    lat = sorted(x / 1000.0 for x in client["lat_ns"])
    lag = sorted(x / 1000.0 for x in client["lag_ns"])
    if len(lat) != count:
        raise ValueError(f"{len(lat)} latency samples for {count} messages")
    ccpu = cpu_us_per_msg(sum(c["cpu_s"] for c, _ in reps), count)
    scpu = cpu_us_per_msg(sum(s["cpu_s"] for _, s in reps), count)
    return {
        "target_per_s": client["rate_target"],
        "achieved_per_s": sum(c["count"] - 1 for c, _ in reps) / spans * 1e9 if spans else 0.0,
        "messages": count,
        **spread(lat, "lat_us"),
        "send_lag_us_p50": percentile(lag, 50),
        "send_lag_us_p99": percentile(lag, 99),
        "send_lag_us_max": lag[-1],
        "client_cpu_us_per_msg": ccpu,
        "server_cpu_us_per_msg": scpu,
        "cpu_us_per_msg": ccpu + scpu,
        "window_s": sum(c["ns"] for c, _ in reps) / 1e9,
    }


RATIO_KEYS = {  # summary key -> ratio key of rsock against TCP (subject / baseline)
    "client_cpu_us_per_msg": "client_cpu_ratio",
    "server_cpu_us_per_msg": "server_cpu_ratio",
    "cpu_us_per_msg": "cpu_ratio",
    "lat_us_p50": "p50_ratio",
    "lat_us_p99": "p99_ratio",
    "lat_us_p99_9": "p99_9_ratio",
    "achieved_per_s": "achieved_ratio",
}


def ratios(subject: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float | None]:
    """subject / baseline of each ``RATIO_KEYS`` figure (< 1: less CPU or latency)."""
    out: dict[str, float | None] = {}
    for key, name in RATIO_KEYS.items():
        a, b = subject.get(key), baseline.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
            out[name] = a / b
        else:
            out[name] = None
    return out


# --------------------------------------------------------------------------- the timer


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
_libc: Any = None


def _timespec(ns: int) -> _Timespec:
    return _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)


class Timer:
    """A periodic timerfd on CLOCK_MONOTONIC (Linux): ``arm(start, period)``
    makes it expire at ``start`` and every ``period`` ns after; ``read()`` is the
    number of expirations since the last read (blocking, or 0 if none when
    ``nonblocking``)."""

    def __init__(self, nonblocking: bool = False) -> None:
        global _libc
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        flags = TFD_CLOEXEC | (TFD_NONBLOCK if nonblocking else 0)
        fd = int(_libc.timerfd_create(CLOCK_MONOTONIC, flags))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self.fd = fd

    def arm(self, start_ns: int, period: int) -> None:
        spec = _Itimerspec(_timespec(period), _timespec(start_ns))
        if _libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def read(self) -> int:
        try:
            data = os.read(self.fd, 8)
        except BlockingIOError:
            return 0
        return int(struct.unpack("=Q", data)[0])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def phase_record(
    kind: str, sender: Sender, replies: Replies, c0: float, c1: float, t1: int
) -> dict[str, Any]:
    """One phase as the client reports it (the samples go separately; ``nbad``:
    echoes that differ from their request, a verification failure)."""
    return {
        "kind": kind,
        "count": replies.count,
        "ns": t1 - sender.sched.start,  # from the first scheduled send to the last reply
        "cpu_s": c1 - c0,
        "reply_span_ns": replies.t_last - replies.t_first,
        "late_sends": sum(1 for x in sender.lag if x > sender.sched.period),
        "nbad": replies.nbad,
        "first_bad_seq": replies.first_bad,
    }


# --------------------------------------------------------------------------- sync client


class _Conn(Protocol):
    def sendall(self, data: bytes, /) -> None: ...

    def recv_into(self, buffer: memoryview, nbytes: int = ..., /) -> int: ...


def _receive(conn: _Conn, replies: Replies, errors: list[BaseException]) -> None:
    """The receiver thread: blocking reads until the phase's echoes are all in."""
    try:
        recv_into, take, clock = conn.recv_into, replies.take, time.monotonic_ns
        while not replies.done:
            space = replies.space()
            n = recv_into(space, len(space))
            t = clock()
            if n == 0:
                raise ConnectionError(
                    f"peer closed the connection, {replies.count - replies.got} echoes short"
                )
            take(n, t)
    except BaseException as exc:  # noqa: BLE001 - handed to the sending thread
        errors.append(exc)


def run_phase_sync(
    conn: _Conn, kind: str, count: int, seq0: int, period: int
) -> tuple[dict[str, Any], Sender, Replies]:
    """One phase on a blocking socket: this thread sends on the timer's schedule,
    a second thread receives and timestamps."""
    timer = Timer()
    try:
        c0 = cpu_seconds()
        sched = Schedule(time.monotonic_ns() + LEAD_NS, period)
        sender, replies = Sender(sched, count), Replies(sched, count, seq0)
        errors: list[BaseException] = []
        rx = threading.Thread(target=_receive, args=(conn, replies, errors), daemon=True)
        rx.start()
        timer.arm(sched.start, period)
        sendall, clock, read = conn.sendall, time.monotonic_ns, timer.read
        while not sender.done and not errors:
            for i in sender.due(read(), clock()):
                sendall(message(seq0 + i))
        rx.join()
        t1, c1 = replies.t_last, cpu_seconds()
    finally:
        timer.close()
    if errors:
        raise errors[0]
    return phase_record(kind, sender, replies, c0, c1, t1), sender, replies


# --------------------------------------------------------------------------- asyncio client


class RateClient(asyncio.BufferedProtocol):
    """The client on an event loop: receives straight into the phase's
    ``Replies`` (timestamped in ``buffer_updated``); between phases, raw bytes
    (the session's final ack) into a small buffer."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.replies: Replies | None = None
        self.done: asyncio.Future[None] | None = None
        self.raw = memoryview(bytearray(RECV_BUF))
        self.raw_have = 0
        self.raw_need = 0
        self.raw_waiter: asyncio.Future[None] | None = None
        self.lost: BaseException | None = None
        self.closed: asyncio.Future[None] = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.replies is not None:
            return self.replies.space()
        return self.raw[self.raw_have :]

    def buffer_updated(self, nbytes: int) -> None:
        rp = self.replies
        if rp is not None:
            rp.take(nbytes, time.monotonic_ns())
            if rp.done:
                self.replies = None
                if self.done is not None and not self.done.done():
                    self.done.set_result(None)
            return
        self.raw_have += nbytes
        w = self.raw_waiter
        if w is not None and self.raw_have >= self.raw_need and not w.done():
            w.set_result(None)

    def expect(self, replies: Replies) -> asyncio.Future[None]:
        self.replies = replies
        self.done = self.loop.create_future()
        return self.done

    async def read_raw(self, n: int) -> bytes:
        """The next ``n`` bytes outside a phase."""
        if self.raw_have < n:
            if self.lost is not None:
                raise self.lost
            self.raw_need = n
            self.raw_waiter = self.loop.create_future()
            try:
                await self.raw_waiter
            finally:
                self.raw_waiter = None
        if self.raw_have < n and self.lost is not None:
            raise self.lost
        data = bytes(self.raw[:n])
        self.raw_have = 0
        return data

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionError("server closed the connection")
        for fut in (self.done, self.raw_waiter, self.closed):
            if fut is not None and not fut.done():
                if fut is self.closed:
                    fut.set_result(None)
                else:
                    fut.set_exception(self.lost)


async def run_phase_async(
    proto: RateClient, kind: str, count: int, seq0: int, period: int
) -> tuple[dict[str, Any], Sender, Replies]:
    """One phase on an event loop: the timer is a reader of the loop that writes
    whatever is due; ``proto`` takes the echoes."""
    loop = asyncio.get_running_loop()
    tr = proto.transport
    assert tr is not None
    write = tr.write
    timer = Timer(nonblocking=True)
    try:
        c0 = cpu_seconds()
        sched = Schedule(time.monotonic_ns() + LEAD_NS, period)
        sender, replies = Sender(sched, count), Replies(sched, count, seq0)
        done = proto.expect(replies)
        clock, read = time.monotonic_ns, timer.read

        def on_timer() -> None:
            k = read()
            if k:
                for i in sender.due(k, clock()):
                    write(message(seq0 + i))
                if sender.done:
                    loop.remove_reader(timer.fd)

        loop.add_reader(timer.fd, on_timer)
        try:
            timer.arm(sched.start, period)
            await done
        finally:
            loop.remove_reader(timer.fd)
        t1, c1 = replies.t_last, cpu_seconds()
    finally:
        timer.close()
    return phase_record(kind, sender, replies, c0, c1, t1), sender, replies
