"""asyncio over rsock: a Transport/Protocol adapter and the streams API.

uvloop's ``create_server(sock=...)``/``create_connection(sock=...)`` hand
``sock.fileno()`` to libuv as a kernel socket, so rsock brings its own
Transport.  It is driven only by ``loop.add_reader`` on the engine's notify
fd (which the engine keeps readable exactly while the socket is ready:
"interest" IN for data/EOF/errors, OUT while we have bytes queued and wait
for send space; RSK_WATCH_NOTIFY) and on the liveness fd, which works the
same on asyncio and uvloop and needs no thread (``fileno()`` would: it is
kept exact by the engine's watcher thread).  The engine arms its
notification and re-polls before the fd can look idle, so the loop may
sleep on it safely; the loop thread never spins
(the socket's spin time is set to 0 unless ``RSOCK_SPIN_US`` says
otherwise).

Entry points mirror the loop's and asyncio's: :func:`create_server`,
:func:`create_connection`, :func:`start_server`, :func:`open_connection`,
:func:`start_tls` and :func:`sendfile` (``loop.start_tls``/``loop.sendfile`` of
an rsock transport).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import io
import os
import socket as _std
import ssl as _ssl
import stat
import time
import warnings
from asyncio import constants, sslproto, transports
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from rsock import _lowlevel as _ll
from rsock._paths import env_raw
from rsock._readiness import (  # (the budget: trio's poller in rsock._patch reads it too)
    _POLL_SLICE_US,
    POLLIN,
    POLLOUT,
    Watch,
    _loop_poll_us,
)
from rsock._socket import check_sendfile_file, socket

_fast_send = _ll.fast_send
_fast_recv_into = _ll.fast_recv_into
_fast_recv_bytes = _ll.fast_recv_bytes

__all__ = [
    "create_server",
    "create_connection",
    "start_server",
    "open_connection",
    "start_tls",
    "sendfile",
]

# Bytes per recv for a plain Protocol: what is readable now, up to 1 MiB, in
# one bytes object of its size, copied once straight out of the ring
# (_fastcall.recv_bytes: one call; a ring's wrap splits it).  Fewer, larger
# chunks save the receiver copies: a 1 MiB body that arrives in one chunk
# is one bytes object all the way up to aiohttp's ClientResponse.read() (in
# sixteen 64 KiB chunks it was joined once more).  Blocks this large come
# from the heap only because the first socket raised glibc's mmap threshold
# (_lowlevel.HEAP_HINT); before that, 256 KiB reads made glibc trim and
# regrow the heap's top around every read.  aiohttp 1 MiB GET against TCP,
# same run: with the hint, 64 KiB reads 1.12-1.24x, 1.52-1.60x with 1 MiB
# reads; python -m rsock.bench apps, A/B: 1.21x, 1.29x (64 KiB reads, no
# hint) -> 1.48x, 1.50x (streamed 5.1-5.8x -> 8.8-9.5x).
_MAX_READ = 1024 * 1024
# After a read this large the transport reads again at once (the sender is
# likely streaming: one more call, EAGAIN at worst); after a smaller one it
# returns to the loop (the engine keeps the fd readable if more came).
# Returning after every read shorter than _MAX_READ halved asyncio's 1 MiB
# stream and cut its 64 B msgrate by a third (one loop round per read).
_MORE_AFTER = 16 * 1024
_ACCEPT_RETRY_DELAY = 1.0  # asyncio's constants.ACCEPT_RETRY_DELAY
_READS_PER_WAKEUP = 32  # then yield to other callbacks (the fd stays readable)
_DEFAULT_HIGH = 64 * 1024
# sendfile: bytes read from the file per step, into one buffer and from there
# into the ring (a quarter of a default ring; stays in the CPU's cache between
# the two copies)
_SENDFILE_CHUNK = 256 * 1024
_SENDFILE_YIELD = 1024 * 1024  # sendfile lets the loop run after this many bytes
_SPIN_ENV = os.fsencode("RSOCK_SPIN_US")  # (for _paths.env_raw)


def _loop_spin(sock: socket) -> None:
    """No spinning on the loop thread unless the user asked for it (an
    accepted connection has its listener's: set once, on the listener)."""
    if env_raw(_SPIN_ENV, "RSOCK_SPIN_US") is not None:
        return
    h = sock._h
    if h is not None:
        # (what setsockopt(SOL_RSOCK, RSOCK_SPIN_US, 0) does, without its checks)
        _ll.set_opt(h, "spin_us", 0)


# a loop that came back to the poller later than this ran other callbacks
# meanwhile (a round of uvloop's with only the poller takes ~2 µs here)
_POLL_GAP_NS = 8_000
# A connection polls for at most its own budget after its last activity,
# RSOCK_LOOP_POLL_US to start with: halved when something comes after a
# second quiet spell in a row longer than twice RSOCK_LOOP_POLL_US, with
# nothing caught by polling in between (a peer that slow gains nothing from
# our polling: a synchronous client that thinks between requests; one slow
# answer, as a handshake's, is not a tempo), raised to twice a shorter
# spell, up to RSOCK_LOOP_POLL_US (a spell seen by a connection that was
# not polled includes the wake-up that polling saves); below _POLL_MIN_NS
# it is not polled (the loop's readers wake it) until a shorter spell comes.
_POLL_MIN_NS = 5_000
_POLL_UNSET = 1 << 62  # (a new connection's budget: the loop's)


class _Pollable(Protocol):
    """What the poller polls: a transport, or a patched loop's route of a
    ``fileno()`` reader (``rsock._patch._FdRoute``)."""

    _watch: Watch
    _polled: bool  # hot: in the poller, the engine's polling mode on
    _poll_seen: bool  # active since the poller's last sweep
    _poll_last: int  # when last seen active (monotonic ns)
    _poll_budget: int  # how long it is polled after its last activity (ns)
    _poll_long: int  # long quiet spells in a row, nothing caught by polling since

    def _on_ready(self) -> None: ...


class _LoopPoller:
    """Polling on one loop (``RSOCK_LOOP_POLL_US``): a transport that was
    active (data came, or it wrote) stays *hot* for that long after its
    last activity, and while any is hot the loop looks at their rings
    itself instead of sleeping on their notify fds.

    It runs as a callback that busy-polls the hot rings for a slice
    (``_POLL_SLICE_US``, the GIL released; no spin at all while the loop
    has other callbacks to run), calls ``_on_ready`` of the transports
    found ready, and schedules itself again with ``call_soon``, so the
    loop's other fds, timers and callbacks get their turn between slices.
    A hot connection is in the engine's polling mode: its peer writes no
    eventfd and nothing wakes the loop per message.  A transport idle for
    the whole budget goes back to the loop's readers (the engine arms and
    makes its notify fd exact again); with none hot, the poller stops and
    the loop sleeps as usual, so idle connections cost nothing and a
    loop with many connections polls only the busy ones.  After a hot
    transport closed, the poller stays scheduled (spinning on nothing)
    for what was left of that transport's budget, so that the loop looks
    at its own fds without sleeping meanwhile: a server whose connection
    just ended takes the next client's (its listener turning readable)
    without being put to sleep and woken, as it took the last request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, budget_us: int) -> None:
        self._loop = loop
        self._budget_ns = budget_us * 1000
        self._slice_us = min(budget_us, _POLL_SLICE_US)
        self._sweep_ns = max(self._budget_ns // 4, 10_000)
        self._hot: list[_Pollable] = []
        self._snap: tuple[_Pollable, ...] = ()
        self._set: _ll.SpinSet | None = None
        self._running = False
        self._swept = 0
        self._last_end = 0  # when the last look ended
        self._linger = 0  # a closed hot transport's budget ends then (monotonic ns)
        ready = getattr(loop, "_ready", None)  # asyncio's BaseEventLoop
        self._queue: collections.deque[Any] | None = (
            ready if isinstance(ready, collections.deque) else None
        )

    def touch(self, tr: _Pollable, came: bool = False) -> None:
        """``tr`` was active and is not hot: it is now, unless its budget
        fell below _POLL_MIN_NS.  ``came``: the activity is something that
        came (the loop's reader woke it), which ends a quiet spell: its
        length adapts the budget."""
        now = time.monotonic_ns()
        b = tr._poll_budget
        if b > self._budget_ns:
            b = self._budget_ns
        if came and tr._poll_last:
            quiet = now - tr._poll_last
            if quiet > 2 * self._budget_ns:
                tr._poll_long += 1
                if tr._poll_long > 1:
                    b >>= 1
            else:
                tr._poll_long = 0
                b = min(self._budget_ns, max(b, 2 * quiet, _POLL_MIN_NS))
        tr._poll_budget = b
        tr._poll_last = now
        if b < _POLL_MIN_NS:
            # not polled: the loop's readers wake it (a transport or route
            # that started in polling mode leaves it here: with a budget
            # under _POLL_MIN_NS it never became hot, and nothing woke it)
            tr._watch.set_polled(self._loop, tr._on_ready, False)
            return
        tr._polled = tr._poll_seen = True
        self._hot.append(tr)
        self._set = None
        self._snap = ()
        tr._watch.set_polled(self._loop, tr._on_ready, True)
        if not self._running:
            self._running = True
            self._loop.call_soon(self._run)

    def _drop(self, tr: _Pollable) -> None:
        tr._polled = False
        self._hot.remove(tr)
        # the set and its snapshot hold the members: rebuilt at the next
        # look, and nothing is kept alive in between (a closed transport
        # is garbage at once, as asyncio's leak tests check)
        self._set = None
        self._snap = ()

    def _cool(self, tr: _Pollable) -> None:
        self._drop(tr)
        tr._watch.set_polled(self._loop, tr._on_ready, False)

    def leave(self, tr: _Pollable) -> None:
        """``tr`` is closing (its watch is disarmed next)."""
        if tr._polled:
            self._drop(tr)
            end = tr._poll_last + min(tr._poll_budget, self._budget_ns)
            if end > self._linger:
                self._linger = end

    def _sweep(self, now: int) -> None:
        self._swept = now
        for tr in tuple(self._hot):
            if tr._poll_seen:
                tr._poll_seen = False
                tr._poll_last = now
            elif now - tr._poll_last >= tr._poll_budget:
                self._cool(tr)

    def _run(self) -> None:
        if not self._hot:
            if self._linger and time.monotonic_ns() < self._linger:
                self._loop.call_soon(self._run)  # (the loop polls its fds meanwhile)
                return
            self._linger = 0
            self._running = False
            return
        if self._set is None:
            self._snap = tuple(self._hot)
            self._set = _ll.SpinSet([tr._watch.handle for tr in self._snap])
        snap = self._snap
        # spin only while the loop has nothing else to do: asyncio's loops
        # show their queue of callbacks; on others (uvloop), other callbacks
        # ran since the last look if the loop took long to come back
        start = time.monotonic_ns()
        queue = self._queue
        idle = not queue if queue is not None else start - self._last_end < _POLL_GAP_NS
        try:
            ready = self._set.spin(self._slice_us if idle else 0)
            now = self._last_end = time.monotonic_ns()
            for i in ready:
                snap[i]._poll_seen = True
                snap[i]._poll_long = 0  # polling caught something
            if now - self._swept >= self._sweep_ns:
                self._sweep(now)
            for i in ready:
                tr = snap[i]
                if tr._polled:
                    tr._on_ready()
        finally:
            if self._hot or self._linger:
                self._loop.call_soon(self._run)
            else:
                self._running = False


def _poller_for(loop: asyncio.AbstractEventLoop, sock: socket) -> _LoopPoller | None:
    """The loop's poller (made at its first rsock transport) for ``sock``, or
    None when polling is off (``RSOCK_LOOP_POLL_US=0``), the loop takes no
    attributes, or ``sock`` is not on shm (over verbs the loop sleeps on
    the completion channel, as before: polling is not tested there yet)."""
    us = _loop_poll_us()
    if not us or sock.provider != "shm":
        return None
    p: _LoopPoller | None = getattr(loop, "_rsock_poller", None)
    if p is None:
        p = _LoopPoller(loop, us)
        try:
            loop._rsock_poller = p  # type: ignore[attr-defined]
        except AttributeError:
            return None
    return p


class RsockTransport(transports._FlowControlMixin):
    """``asyncio.Transport`` over a connected rsock socket.

    A ``_FlowControlMixin`` (the class of the loops' own socket transports;
    its methods are all overridden here) so that an unpatched
    ``loop.sendfile()`` takes its read-and-write fallback: asyncio accepts
    only those for it.  :func:`sendfile` is the native path (under
    ``rsock.patch()``, ``loop.sendfile`` of an rsock transport)."""

    _sendfile_compatible = constants._SendfileMode.FALLBACK

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket,
        protocol: asyncio.BaseProtocol,
        server: RsockServer | None = None,
        waiter: asyncio.Future[None] | None = None,
    ) -> None:
        super().__init__(None, loop)
        try:
            self._poller = _poller_for(loop, sock)
        except ValueError:  # a bad RSOCK_LOOP_POLL_US
            sock.close()
            raise
        self._info: dict[str, Any] = {"socket": sock}
        self._loop = loop
        self._sock = sock
        self._protocol = protocol
        self._server = server
        sock.setblocking(False)
        if server is None:  # (an accepted one has its listener's)
            _loop_spin(sock)
        # the engine keeps its notify fd readable exactly while we are
        # ready: the loop watches it and the liveness fd (no thread)
        self._watch = sock.watch()
        # a new connection starts hot: its first bytes are usually there
        # already, or follow at once (no notify fd to kick and drain)
        self._handle = self._watch.start(polled=self._poller is not None)
        try:
            self._info["peername"] = sock.getpeername()
        except OSError:
            self._info["peername"] = None
        self._info["sockname"] = sock.getsockname()
        self._info["sslcontext"] = None
        self._buffer: collections.deque[memoryview] = collections.deque()
        self._buffer_size = 0
        self._high = _DEFAULT_HIGH
        self._low = _DEFAULT_HIGH // 4
        self._protocol_paused = False
        self._reading = True
        self._eof = False  # peer EOF seen
        self._write_eof_pending = False
        self._closing = False
        self._conn_lost = 0
        # on uvloop, once connection_lost ran, the calls that write raise as
        # uvloop's own transports do (its handle is closed); asyncio's ignore
        self._on_uvloop = type(loop).__module__.partition(".")[0] == "uvloop"
        self._handle_closed = False
        self._write_failing = False  # a send failed: _fail_after_reading is due
        self._empty_waiter: asyncio.Future[None] | None = None  # sendfile's
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)
        self._polled = False  # hot in the poller (the engine's polling mode)
        self._poll_seen = False  # active since the poller's last sweep
        self._poll_last = 0
        self._poll_budget = _POLL_UNSET
        self._poll_long = 0
        if server is not None:
            server._attach()
        self._loop.call_soon(self._connection_made, waiter)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._info.get(name, default)

    # ---------------------------------------------------------------- setup

    def _connection_made(self, waiter: asyncio.Future[None] | None) -> None:
        try:
            self._protocol.connection_made(self)
        except BaseException as exc:
            if waiter is not None and not waiter.cancelled():
                waiter.set_exception(exc)
            self._force_close(exc if isinstance(exc, Exception) else None)
            if not isinstance(exc, Exception):
                raise
            return
        if waiter is not None and not waiter.cancelled():
            waiter.set_result(None)
        poller = self._poller
        if poller is not None and not self._polled:
            # started in polling mode (Watch.start): hot now, or, closing
            # already, back to the loop's readers for what is left
            if self._closing or self._conn_lost:
                self._watch.set_polled(self._loop, self._on_ready, False)
            else:
                poller.touch(self)
        self._update_interest()
        if self._server is not None and self._reading and not (self._eof or self._closing):
            # a client's first bytes usually came with its connect (before
            # the accept): read them now, not a loop round later
            self._read_ready()

    def _update_interest(self) -> None:
        """Tell the engine what should wake us (the watch (un)registers the
        notify fd's reader; the liveness fd's stays while the peer may go)."""
        if self._conn_lost:
            return
        want = 0
        if self._reading and not self._eof and not self._closing:
            want |= POLLIN
        if self._buffer:
            want |= POLLOUT
        self._watch.arm(self._loop, self._on_ready, want)

    # ---------------------------------------------------------------- events

    def _lost(self) -> bool:
        return self._conn_lost > 0

    def _on_ready(self) -> None:
        # Every other state change (pause/resume, write, close, EOF) updates
        # the interest itself; here only a flush can change it.
        if self._lost():
            return
        if self._polled:
            self._poll_seen = True
        elif self._poller is not None:
            self._poller.touch(self, True)  # poll for a while before sleeping again
        if self._buffer:
            self._flush()  # may lose the connection or empty the buffer
            if self._lost():
                return
            self._update_interest()
        if self._reading and not self._eof and not self._closing:
            self._read_ready()

    def _read_ready(self, drain: bool = False) -> None:
        # Raw engine calls (-errno, no exceptions on EAGAIN).  A short read
        # means the ring is empty: stop there, the engine keeps the fd
        # readable if more arrives (level-triggered), so nothing is missed.
        # drain: only hand over what the ring holds (until it is empty, EOF
        # or an error, which are left to the caller: _fail_after_reading)
        if self._write_failing and not drain:
            return  # (_fail_after_reading is due: it reads, then reports)
        addr = self._handle.addr
        for _ in range(_READS_PER_WAKEUP):
            if not self._reading or self._conn_lost:
                return
            if self._buffered:
                proto: Any = self._protocol
                try:
                    buf = proto.get_buffer(-1)
                    size = len(buf)
                    if not size:
                        raise RuntimeError("get_buffer() returned an empty buffer")
                    n = _fast_recv_into(addr, buf, 0)
                    del buf  # no view of the protocol's buffer outlives the call
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._fatal_error(exc, "Fatal error: protocol.get_buffer() call failed.")
                    return
                if n > 0:
                    try:
                        proto.buffer_updated(n)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        self._fatal_error(
                            exc, "Fatal error: protocol.buffer_updated() call failed."
                        )
                        return
                    if n < size and not drain:
                        return
                    continue
            else:
                r = _fast_recv_bytes(addr, _MAX_READ, 0)
                if isinstance(r, bytes):
                    n = len(r)
                    if n:
                        try:
                            self._protocol.data_received(r)  # type: ignore[attr-defined]
                        except (SystemExit, KeyboardInterrupt):
                            raise
                        except BaseException as exc:
                            self._fatal_error(
                                exc, "Fatal error: protocol.data_received() call failed."
                            )
                            return
                        if n < _MORE_AFTER and not drain:
                            return  # a small read: the ring is most likely empty
                        continue  # (a large one: more is often on its way)
                else:
                    n = r
            if n == -errno.EINTR:
                continue
            if drain or n == -errno.EAGAIN:
                return
            if n == 0:
                self._read_eof()
                return
            self._fatal_error(self._watch.error(n), "Fatal read error on rsock transport")
            return

    def _read_eof(self) -> None:
        self._eof = True
        try:
            keep_open = self._protocol.eof_received()  # type: ignore[attr-defined]
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.eof_received() call failed.")
            return
        if not keep_open:
            self.close()

    # ---------------------------------------------------------------- writing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        t = type(data)
        if (
            (t is bytes or t is bytearray)
            and not data
            and not self._write_eof_pending
            and not self._handle_closed
        ):
            return  # (h11's end of a sized body: no engine call, no activity)
        if self._polled:
            self._poll_seen = True  # an answer may come: go on polling
        elif self._poller is not None:
            self._poller.touch(self)
        if (
            (t is bytes or t is memoryview or t is bytearray)
            and not self._buffer
            and not self._conn_lost
            and not self._write_eof_pending
        ):
            # hot path: nothing queued, the whole message goes at once
            try:
                rc: int = _fast_send(self._handle.addr, data, 0)
            except BufferError:  # not contiguous: the long way below
                rc = -errno.EAGAIN
            else:
                if rc == (data.nbytes if isinstance(data, memoryview) else len(data)):
                    return  # all of it (or empty data: nothing to do)
            if rc > 0:
                data = (memoryview(data).cast("B") if isinstance(data, memoryview) else data)[rc:]
            elif rc not in (-errno.EAGAIN, -errno.EINTR):
                self._write_failed(self._watch.error(rc))
                return
        self._ensure_alive()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"data argument must be a bytes-like object, not {type(data).__name__!r}"
            )
        if isinstance(data, memoryview) and data.format != "B":
            # counted and sliced in bytes from here on
            if not data.c_contiguous:
                raise BufferError("memoryview: underlying buffer is not C-contiguous")
            data = data.cast("B")
        if self._write_eof_pending:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data:
            return
        if self._conn_lost:
            if self._conn_lost >= 5:
                self._loop.call_exception_handler(
                    {"message": "socket.send() raised exception.", "transport": self}
                )
            self._conn_lost += 1
            return
        if not self._buffer:
            # fast path: write at once, buffer only the rest
            n = self._send(data)
            if n < 0:
                return
            if n == len(data):
                return
            data = memoryview(data)[n:]
            self._buffer.append(memoryview(bytes(data)))
        else:
            self._buffer.append(memoryview(bytes(data)))
        self._buffer_size += len(data)
        self._update_interest()
        self._maybe_pause_protocol()

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self.write(b"".join(list_of_data))

    def _send(self, data: Any, raise_fatal: bool = False) -> int:
        """Non-blocking send: bytes taken (0 if none fit), or -1 after a
        fatal error was handled (and raised, with ``raise_fatal``)."""
        while True:
            rc: int = _fast_send(self._handle.addr, data, 0)
            if rc >= 0:
                return rc
            if rc == -errno.EAGAIN:
                return 0
            if rc != -errno.EINTR:
                exc = self._watch.error(rc)
                if raise_fatal:
                    self._fatal_error(exc, "Fatal write error on rsock transport")
                    raise exc
                self._write_failed(exc)
                return -1

    def _flush(self) -> None:
        while self._buffer:
            chunk = self._buffer[0]
            n = self._send(chunk)
            if n < 0:
                return
            if n == 0:
                break
            self._buffer_size -= n
            if n == len(chunk):
                self._buffer.popleft()
            else:
                self._buffer[0] = chunk[n:]
                break
        self._maybe_resume_protocol()
        if not self._buffer:
            waiter = self._empty_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            if self._closing:
                self._loop.call_soon(self._call_connection_lost, None)
                self._conn_lost += 1
            elif self._write_eof_pending:
                self._do_write_eof()

    def can_write_eof(self) -> bool:
        return True

    def _ensure_alive(self) -> None:
        if self._handle_closed:
            raise RuntimeError(f"unable to perform operation on {self!r}; the handler is closed")

    def write_eof(self) -> None:
        self._ensure_alive()
        if self._closing or self._write_eof_pending:
            return
        self._write_eof_pending = True
        if not self._buffer:
            self._do_write_eof()

    def _do_write_eof(self) -> None:
        try:
            self._sock.shutdown(_std.SHUT_WR)
        except OSError as exc:
            self._fatal_error(exc, "Fatal error on rsock transport write_eof()")

    def get_write_buffer_size(self) -> int:
        return self._buffer_size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low, self._high)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._ensure_alive()
        if high is None:
            high = _DEFAULT_HIGH if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause_protocol()

    def _maybe_pause_protocol(self) -> None:
        if self._buffer_size <= self._high or self._protocol_paused:
            return
        self._protocol_paused = True
        try:
            self._protocol.pause_writing()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler(
                {
                    "message": "protocol.pause_writing() failed",
                    "exception": exc,
                    "transport": self,
                    "protocol": self._protocol,
                }
            )

    def _maybe_resume_protocol(self) -> None:
        if self._protocol_paused and self._buffer_size <= self._low:
            self._protocol_paused = False
            try:
                self._protocol.resume_writing()
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._loop.call_exception_handler(
                    {
                        "message": "protocol.resume_writing() failed",
                        "exception": exc,
                        "transport": self,
                        "protocol": self._protocol,
                    }
                )

    # ---------------------------------------------------------------- reading

    def pause_reading(self) -> None:
        if self._closing or not self._reading:
            return
        self._reading = False
        self._update_interest()

    def resume_reading(self) -> None:
        if self._closing or self._reading:
            return
        self._reading = True
        self._update_interest()

    def is_reading(self) -> bool:
        return self._reading and not self._closing and not self._conn_lost

    # ---------------------------------------------------------------- closing

    def is_closing(self) -> bool:
        # (a failed send closes the transport, as asyncio's: once the data
        # the peer sent first is read, _fail_after_reading; meanwhile a
        # writer that loops on write() and drain() must still yield, as
        # drain() does only for a closing transport: CPython's
        # test_streams.test_drain_raises spun for good)
        return self._closing or self._write_failing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._buffer:
            self._update_interest()  # still writable interest: the flush ends it
            return
        # nothing left to send: no reader has anything to do any more (the
        # peer's close would otherwise wake the loop once more on the
        # liveness fd, and the engine's interest need not change first)
        self._leave_poller()
        self._watch.disarm(self._loop)
        self._conn_lost += 1
        self._loop.call_soon(self._call_connection_lost, None)

    def abort(self) -> None:
        self._force_close(None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def _write_failed(self, exc: OSError) -> None:
        """A send failed.  A peer that reset (or aborted with our data unread,
        as a server that answers an upload early and closes does) may have
        sent bytes first: as the kernel keeps them readable after a reset,
        and asyncio's loops run a socket's reader before its writer, the
        protocol gets them before the error (they were lost: an aiohttp
        POST to a server that answered 501 early got BrokenPipeError instead
        of the 501).  From the loop, not from inside write()."""
        if self._write_failing:
            return  # (already due)
        if (
            isinstance(exc, (ConnectionResetError, BrokenPipeError))
            and self._reading
            and not self._eof
            and not self._conn_lost
        ):
            self._write_failing = True
            self._buffer.clear()
            self._buffer_size = 0
            self._loop.call_soon(self._fail_after_reading, exc)
            return
        self._fatal_error(exc, "Fatal write error on rsock transport")

    def _fail_after_reading(self, exc: OSError) -> None:
        # (the engine reported the error to the send: a read after the data
        # would say EOF, so the send's error is what the protocol gets)
        if self._reading and not self._eof and not self._conn_lost:
            self._read_ready(drain=True)
        if not self._conn_lost:
            self._fatal_error(exc, "Fatal write error on rsock transport")

    def _fatal_error(self, exc: BaseException, message: str) -> None:
        if not isinstance(exc, OSError):
            self._loop.call_exception_handler(
                {
                    "message": message,
                    "exception": exc,
                    "transport": self,
                    "protocol": self._protocol,
                }
            )
        self._force_close(exc if isinstance(exc, Exception) else None)

    def _force_close(self, exc: Exception | None) -> None:
        if self._conn_lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._buffer_size = 0
        self._fail_empty_waiter()
        self._closing = True
        self._conn_lost += 1
        self._loop.call_soon(self._call_connection_lost, exc)

    def _leave_poller(self) -> None:
        p, self._poller = self._poller, None
        if p is not None:
            p.leave(self)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        self._fail_empty_waiter()
        self._leave_poller()
        self._watch.disarm(self._loop)
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._handle_closed = self._on_uvloop
            self._sock.close()
            server, self._server = self._server, None
            if server is not None:
                server._detach()

    # ---------------------------------------------------------------- sendfile

    def _fail_empty_waiter(self) -> None:
        waiter = self._empty_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("Connection is closed by peer"))

    def _drained(self) -> asyncio.Future[None]:
        """A future done when everything queued is in the ring (at once if
        nothing is); fails if the connection is lost first."""
        waiter = self._loop.create_future()
        if self._conn_lost:
            waiter.set_exception(ConnectionError("Connection is closed by peer"))
        elif not self._buffer:
            waiter.set_result(None)
        else:
            self._empty_waiter = waiter
        return waiter

    def _write_refused(self, data: Any) -> None:
        raise RuntimeError("unable to write; sendfile is in progress")

    async def _sendfile(self, fileno: int, offset: int, count: int | None) -> int:
        """Sends a regular file's bytes from ``offset`` (``count`` of them,
        or up to its end): each step reads up to ``_SENDFILE_CHUNK`` with
        ``os.preadv`` into one buffer and puts them into the ring; when the
        ring is full the rest waits (queued, not copied) for the peer to make
        room, then the next step reads.  Writes are refused and reading is
        paused meanwhile, as on the loops' native path.  Returns the bytes
        sent, and leaves the file's position past them (also when it
        raises)."""
        resume = self.is_reading()
        self.pause_reading()
        self.write = self._write_refused  # type: ignore[method-assign]
        total = 0
        try:
            await self._drained()
            size = _SENDFILE_CHUNK if count is None else min(count, _SENDFILE_CHUNK)
            view = memoryview(bytearray(size))
            unyielded = -1  # bytes sent since the loop last ran (-1: none yet)
            while count is None or total < count:
                if self._conn_lost:  # closed meanwhile
                    raise ConnectionError("Connection is closed by peer")
                n = size if count is None else min(size, count - total)
                got = os.preadv(fileno, [view[:n]], offset + total)
                if not got:
                    break
                if self._polled:
                    self._poll_seen = True
                elif self._poller is not None:
                    self._poller.touch(self)
                sent = self._send(view[:got], raise_fatal=True)
                total += got  # all of it is the stream's now
                if sent < got:
                    # the ring is full: the rest waits in the queue (the
                    # buffer is not read into again before it is drained),
                    # and goes out after a cancellation too, as what the
                    # kernel took from os.sendfile does
                    self._buffer.append(view[sent:got])
                    self._buffer_size += got - sent
                    self._update_interest()
                    await self._drained()
                    unyielded = 0
                elif unyielded < 0 or unyielded + got >= _SENDFILE_YIELD:
                    # a peer that keeps up never fills the ring: let the
                    # loop run now and then; the first time for two rounds,
                    # as the loops' native path takes at least a writer
                    # callback and then the task's wake-up (a caller that
                    # stops the loop meanwhile finds the send in progress)
                    if unyielded < 0:
                        await asyncio.sleep(0)
                    await asyncio.sleep(0)
                    unyielded = 0
                else:
                    unyielded += got
        finally:
            self._empty_waiter = None
            del self.write
            if resume and not self._conn_lost:
                self.resume_reading()
            if total:
                os.lseek(fileno, offset + total, os.SEEK_SET)
        return total

    def __del__(self, _warn: Any = warnings.warn) -> None:
        watch = getattr(self, "_watch", None)
        if watch is not None and watch.is_open():
            if not self._conn_lost:
                _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
                self._sock.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn_lost else ("closing" if self._closing else "open")
        return f"<RsockTransport {state} fd={self._watch.fd} provider={self._sock.provider!r}>"


class RsockServer(asyncio.AbstractServer):
    """``asyncio.AbstractServer`` over listening rsock sockets."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: list[socket],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        sslcontext: _ssl.SSLContext | None = None,
        tls_args: dict[str, Any] | None = None,
    ) -> None:
        self._loop = loop
        self._ssl = sslcontext
        self._tls_args = tls_args or {}
        self._sockets: list[socket] | None = sockets
        self._factory = protocol_factory
        self._active = 0
        self._serving = False
        self._waiters: list[asyncio.Future[None]] | None = []
        self._serving_forever_fut: asyncio.Future[None] | None = None
        for s in sockets:
            s.setblocking(False)
            _loop_spin(s)  # (what the connections it accepts inherit)

    def _attach(self) -> None:
        self._active += 1

    def _detach(self) -> None:
        self._active -= 1
        if self._active == 0 and self._sockets is None:
            self._wakeup()

    def _wakeup(self) -> None:
        waiters, self._waiters = self._waiters, None
        for w in waiters or ():
            if not w.done():
                w.set_result(None)

    def _start_serving(self) -> None:
        if self._serving or self._sockets is None:
            return
        self._serving = True
        for s in self._sockets:
            self._loop.add_reader(s.fileno(), self._accept_ready, s)

    def _resume_accept(self, listener: socket) -> None:
        if self._serving and self._sockets is not None and listener.fileno() >= 0:
            self._loop.add_reader(listener.fileno(), self._accept_ready, listener)

    def _accept_ready(self, listener: socket) -> None:
        # One connection per wake-up: the loop's reader is level-triggered
        # (a listener's fd stays readable while clients wait), so the next
        # comes on the next round; looking for a second one at once cost
        # an empty accept per connection (two system calls and the Python
        # around them) where clients come one at a time.
        try:
            got = listener._accept_nowait()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # as asyncio's loops: say so, stop accepting for a while
                # (the clients stay queued), then start again
                self._loop.call_exception_handler(
                    {"message": "socket.accept() out of system resource", "exception": exc}
                )
                fd = listener.fileno()
                self._loop.remove_reader(fd)
                self._loop.call_later(_ACCEPT_RETRY_DELAY, self._resume_accept, listener)
                return
            raise
        if got is None:
            return  # none left (no BlockingIOError made for it)
        conn = got[0]
        kernel = conn.take_kernel()
        if kernel is not None:
            # a plain TCP client on our port: the loop's own transport
            self._loop.create_task(self._serve_kernel(kernel))
            return
        try:
            protocol = self._factory()
        except BaseException:
            conn.close()
            raise
        if self._ssl is None:
            RsockTransport(self._loop, conn, protocol, server=self)
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        waiter.add_done_callback(self._handshake_done)
        tls = sslproto.SSLProtocol(
            self._loop, protocol, self._ssl, waiter, server_side=True, **self._tls_args
        )
        RsockTransport(self._loop, conn, tls, server=self)

    async def _serve_kernel(self, kernel: _std.socket) -> None:
        """A plain TCP client, served as the loop serves its own (under
        rsock.patch() the loop's method is its original for kernel sockets)."""
        kernel.setblocking(False)
        try:
            await self._loop.connect_accepted_socket(
                self._factory, kernel, ssl=self._ssl, **self._tls_args
            )
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            kernel.close()
            self._loop.call_exception_handler(
                {"message": "Error serving a plain TCP client", "exception": exc}
            )

    def _handshake_done(self, fut: asyncio.Future[None]) -> None:
        # as the loops do: a failed server-side handshake is logged, not raised
        if not fut.cancelled() and fut.exception() is not None and self._loop.get_debug():
            self._loop.call_exception_handler(
                {"message": "Error on TLS handshake", "exception": fut.exception()}
            )

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    @property
    def sockets(self) -> tuple[socket, ...]:
        return tuple(self._sockets or ())

    def close(self) -> None:
        sockets, self._sockets = self._sockets, None
        if sockets is None:
            return
        for s in sockets:
            if self._serving:
                self._loop.remove_reader(s.fileno())
            s.close()
        self._serving = False
        if self._serving_forever_fut is not None and not self._serving_forever_fut.done():
            self._serving_forever_fut.cancel()
            self._serving_forever_fut = None
        if self._active == 0:
            self._wakeup()

    async def start_serving(self) -> None:
        self._start_serving()
        await asyncio.sleep(0)

    async def serve_forever(self) -> None:
        if self._serving_forever_fut is not None:
            raise RuntimeError(f"server {self!r} is already being awaited on serve_forever()")
        if self._sockets is None:
            raise RuntimeError(f"server {self!r} is closed")
        self._start_serving()
        self._serving_forever_fut = self._loop.create_future()
        try:
            await self._serving_forever_fut
        except asyncio.CancelledError:
            try:
                self.close()
                await self.wait_closed()
            finally:
                raise
        finally:
            self._serving_forever_fut = None

    async def wait_closed(self) -> None:
        # Python 3.11's (and uvloop's) semantics: after close() this
        # returns at once; before, it waits for close() and for the last
        # connection to go
        if self._sockets is None or self._waiters is None:
            return
        fut = self._loop.create_future()
        self._waiters.append(fut)
        await fut

    async def __aenter__(self) -> RsockServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


def _ssl_context(ssl: Any, server_side: bool) -> _ssl.SSLContext | None:
    """The loop methods' rules for ``ssl=``: a context, True (default
    client context), or None/False (plain)."""
    if ssl is None or ssl is False:
        return None
    if ssl is True:
        if server_side:
            raise ValueError("ssl=True is not valid for a server: pass an SSLContext")
        return _ssl.create_default_context()
    if not isinstance(ssl, _ssl.SSLContext):
        raise TypeError(f"ssl argument must be an SSLContext or None, got {ssl!r}")
    return ssl


def _ssl_args(kw: dict[str, Any]) -> dict[str, Any]:
    """Pops the TLS keyword arguments the loop methods take."""
    return {
        "ssl_handshake_timeout": kw.pop("ssl_handshake_timeout", None),
        "ssl_shutdown_timeout": kw.pop("ssl_shutdown_timeout", None),
    }


def _check_timeouts(ctx: _ssl.SSLContext | None, args: dict[str, Any]) -> None:
    if ctx is None and any(v is not None for v in args.values()):
        raise ValueError("ssl_handshake_timeout/ssl_shutdown_timeout are only meaningful with ssl")


async def create_server(
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    host: str | Iterable[str] | None = None,
    port: int | None = None,
    *,
    family: int = _std.AF_UNSPEC,
    flags: int = _std.AI_PASSIVE,
    sock: socket | None = None,
    backlog: int = 100,
    reuse_address: bool | None = None,
    reuse_port: bool | None = None,
    start_serving: bool = True,
    ssl: _ssl.SSLContext | None = None,
    **kw: Any,
) -> RsockServer:
    """``loop.create_server`` for rsock, on the running loop (``ssl=``,
    ``ssl_handshake_timeout=`` and ``ssl_shutdown_timeout=`` as there)."""
    ctx = _ssl_context(ssl, server_side=True)
    tls = _ssl_args(kw)
    _check_timeouts(ctx, tls)
    if kw:
        raise TypeError(f"unexpected keyword arguments: {sorted(kw)}")
    _loop_poll_us()  # a bad value is the caller's error, now
    loop = asyncio.get_running_loop()
    if sock is not None:
        if host is not None or port is not None:
            raise ValueError("host/port and sock can not be specified at the same time")
        sockets = [sock]
    else:
        if reuse_address is None:
            reuse_address = True
        hosts: list[str | None]
        if host is None or isinstance(host, str):
            hosts = [host or None]
        else:
            hosts = list(host)
        infos: list[Any] = []
        for h in hosts:
            found = await _getaddrinfo(loop, h, port, family, 0, flags)
            if not found:  # the loops' check and message
                raise OSError(f"getaddrinfo({h!r}) returned empty list")
            infos += found
        seen: set[Any] = set()
        sockets = []
        try:
            for af, _t, proto, _c, sa in infos:
                if (af, sa) in seen or af not in (_std.AF_INET, _std.AF_INET6):
                    continue
                seen.add((af, sa))
                s = socket(af, _std.SOCK_STREAM, proto)
                sockets.append(s)
                if reuse_address:
                    s.setsockopt(_std.SOL_SOCKET, _std.SO_REUSEADDR, 1)
                if reuse_port:
                    s.setsockopt(_std.SOL_SOCKET, _std.SO_REUSEPORT, 1)
                if af == _std.AF_INET6:
                    s.setsockopt(_std.IPPROTO_IPV6, _std.IPV6_V6ONLY, 1)
                try:
                    s.bind(sa)
                except OSError as err:  # (the loops' message, the same errno)
                    strerror = (err.strerror or "").lower()
                    msg = f"error while attempting to bind on address {sa!r}: {strerror}"
                    raise OSError(err.errno, msg) from None
        except BaseException:
            for s in sockets:
                s.close()
            raise
        if not sockets:
            raise OSError(f"could not bind on any address out of {hosts!r}")
    for s in sockets:
        s.listen(backlog)
    server = RsockServer(loop, sockets, protocol_factory, ctx, tls)
    if start_serving:
        server._start_serving()
        await asyncio.sleep(0)
    return server


# fd -> the future of the connect_socket that waits on it now
_connect_owner: dict[int, asyncio.Future[None]] = {}


async def connect_socket(loop: asyncio.AbstractEventLoop, sock: socket, address: Any) -> None:
    """Connects an rsock socket without blocking the loop.  rsock's connect
    completes at once from the listener's queue, with no round trip to the
    server; only a full backlog leaves it in progress, and then its fd polls
    writable when it is done (as TCP's after the SYN-ACK): the loop waits for
    that, then reads the outcome from SO_ERROR.  The socket is left
    non-blocking."""
    sock.setblocking(False)
    # (connect_ex: no exception made for the usual EINPROGRESS)
    err = sock.connect_ex(address)
    if err == errno.EINPROGRESS:
        # Usually done already (EINPROGRESS is what a non-blocking connect
        # reports, as TCP's): a second connect would say so (0) or give
        # the error, and nothing needs the fd (no fileno() pair, no loop
        # round).
        if sock._connected_at_once():
            return
        err = sock.connect_ex(address)
    if err == 0:
        return
    if err == errno.EINTR:  # (as the loops: interrupted means under way)
        err = errno.EINPROGRESS
    if err not in (errno.EALREADY, errno.EINPROGRESS):
        raise OSError(err, f"Connect call failed {address}")
    fd = sock.fileno()
    done: asyncio.Future[None] = loop.create_future()

    def writable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_writer(fd, writable)
    _connect_owner[fd] = done  # a later call on the socket takes the fd over
    try:
        await done
    finally:
        # a call cancelled after a later one took over must leave that
        # one's writer in place (asyncio's connect-racing test)
        if _connect_owner.get(fd) is done:
            del _connect_owner[fd]
            loop.remove_writer(fd)
            sock.watch().drop_fileno()  # the transport watches the notify fd
    err = sock.getsockopt(_std.SOL_SOCKET, _std.SO_ERROR)
    if err:
        raise OSError(err, f"Connect call failed {address}")
    sock.connect(address)  # 0 once done, as TCP's second connect


def _numeric_info(host: Any, port: Any, family: int, proto: int) -> Any:
    """The one address info of a numeric host, as the loops take it without
    resolving (asyncio's ``_ipaddr_info``, uvloop's too), or None: a name,
    a service name, a zone index or another protocol goes to getaddrinfo."""
    if host is None or proto not in (0, _std.IPPROTO_TCP):
        return None
    if port is None or port in ("", b""):
        port = 0
    else:
        try:
            port = int(port)
        except (TypeError, ValueError):
            return None  # a service name ("http")
    if isinstance(host, bytes):
        host = host.decode("idna")
    if not isinstance(host, str) or "%" in host:
        return None
    afs = [family] if family else [_std.AF_INET, _std.AF_INET6]
    for af in afs:
        try:
            _std.inet_pton(af, host)
        except (OSError, ValueError):
            continue
        sa = (host, port, 0, 0) if af == _std.AF_INET6 else (host, port)
        return (af, _std.SOCK_STREAM, _std.IPPROTO_TCP, "", sa)
    return None


async def _getaddrinfo(
    loop: asyncio.AbstractEventLoop, host: Any, port: Any, family: int, proto: int, flags: int
) -> list[Any]:
    """``loop.getaddrinfo`` for a stream socket, skipped for a numeric host
    as the loops skip it: a thread-pool round per connection cost asyncio's
    connection rate a third."""
    info = _numeric_info(host, port, family, proto)
    if info is not None:
        return [info]
    return await loop.getaddrinfo(
        host, port, family=family, type=_std.SOCK_STREAM, proto=proto, flags=flags
    )


def _bind_local(s: socket, family: int, linfos: list[Any]) -> None:
    """Bind s to the first local address of its family, with the loops'
    errors: the address named in a failed bind's message, and an error when
    no local address has the family."""
    errors: list[OSError] = []
    for lfamily, _t, _p, _c, laddr in linfos:
        if lfamily != family:
            continue  # a local address of another family: skipped
        try:
            s.bind(laddr)
            return
        except OSError as exc:
            strerror = (exc.strerror or str(exc)).lower()
            msg = f"error while attempting to bind on address {laddr!r}: {strerror}"
            errors.append(OSError(exc.errno, msg))
    if errors:
        raise errors.pop()
    raise OSError(f"no matching local address with family={family} found")


async def create_connection(
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    host: str | None = None,
    port: int | None = None,
    *,
    family: int = 0,
    proto: int = 0,
    flags: int = 0,
    sock: socket | None = None,
    local_addr: tuple[str, int] | None = None,
    ssl: _ssl.SSLContext | bool | None = None,
    server_hostname: str | None = None,
    **kw: Any,
) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
    """``loop.create_connection`` for rsock, on the running loop (``ssl=``,
    ``server_hostname=``, ``ssl_handshake_timeout=``, ``ssl_shutdown_timeout=``
    as there: TLS runs in asyncio's own SSLProtocol over the rsock transport,
    on asyncio and on uvloop alike)."""
    ctx = _ssl_context(ssl, server_side=False)
    tls = _ssl_args(kw)
    _check_timeouts(ctx, tls)
    _loop_poll_us()  # a bad value is the caller's error, before connecting
    if ctx is None and server_hostname is not None:
        raise ValueError("server_hostname is only meaningful with ssl")
    if ctx is not None and server_hostname is None:
        if not host:  # None or "", as the loops check
            raise ValueError("You must set server_hostname when using ssl without a host")
        server_hostname = host
    kw.pop("happy_eyeballs_delay", None)
    kw.pop("interleave", None)
    kw.pop("all_errors", None)
    if kw:
        raise TypeError(f"unexpected keyword arguments: {sorted(kw)}")
    loop = asyncio.get_running_loop()
    if sock is None:
        if host is None and port is None:
            raise ValueError("host and port was not specified and no sock specified")
        infos = await _getaddrinfo(loop, host, port, family, proto, flags)
        if not infos:
            raise OSError("getaddrinfo() returned empty list")
        linfos = None
        if local_addr is not None:
            # resolved once, as the loops do (a host of None: getaddrinfo's
            # answer, the loopback address)
            linfos = await _getaddrinfo(loop, *local_addr, family, proto, flags)
            if not linfos:
                raise OSError("getaddrinfo() returned empty list")
        errors: list[OSError] = []
        for af, _t, pr, _c, sa in infos:
            if int(af) not in (_std.AF_INET, _std.AF_INET6):
                continue
            s = socket(af, _std.SOCK_STREAM, pr)
            try:
                if linfos is not None:
                    _bind_local(s, af, linfos)
                await connect_socket(loop, s, sa)
            except OSError as exc:
                s.close()
                errors.append(exc)
                continue
            except BaseException:
                s.close()
                raise
            sock = s
            break
        if sock is None:
            if len(errors) == 1:
                raise errors[0]
            raise OSError(f"Multiple exceptions: {', '.join(str(e) for e in errors)}")
    kernel = sock.take_kernel()
    if kernel is not None:
        # a plain TCP peer (fallback): the loop's own transport runs it
        kernel.setblocking(False)
        return await loop.create_connection(
            protocol_factory,
            sock=kernel,
            ssl=ctx,
            server_hostname=server_hostname if ctx is not None else None,
            **tls,
        )
    protocol = protocol_factory()
    waiter: asyncio.Future[None] = loop.create_future()
    if ctx is None:
        transport = RsockTransport(loop, sock, protocol, waiter=waiter)
        app: asyncio.Transport = transport
    else:
        tls_proto = sslproto.SSLProtocol(
            loop,
            protocol,
            ctx,
            waiter,
            server_side=False,
            server_hostname=server_hostname,
            **tls,
        )
        transport = RsockTransport(loop, sock, tls_proto)
        app = tls_proto._app_transport
    try:
        await waiter
    except BaseException:
        transport.close()
        raise
    return app, protocol


async def start_tls(
    transport: asyncio.BaseTransport,
    protocol: asyncio.BaseProtocol,
    sslcontext: _ssl.SSLContext,
    *,
    server_side: bool = False,
    server_hostname: str | None = None,
    ssl_handshake_timeout: float | None = None,
    ssl_shutdown_timeout: float | None = None,
) -> asyncio.Transport:
    """``loop.start_tls`` for an rsock transport (uvloop's own refuses
    foreign transports): upgrades it in place and returns the TLS transport."""
    if not isinstance(transport, RsockTransport):
        raise TypeError(f"transport {transport!r} is not an rsock transport")
    if not isinstance(sslcontext, _ssl.SSLContext):
        raise TypeError(f"sslcontext must be an ssl.SSLContext, got {sslcontext!r}")
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    tls = sslproto.SSLProtocol(
        loop,
        protocol,
        sslcontext,
        waiter,
        server_side,
        server_hostname,
        call_connection_made=False,
        # typeshed says int; asyncio takes any number of seconds
        ssl_handshake_timeout=ssl_handshake_timeout,  # type: ignore[arg-type]
        ssl_shutdown_timeout=ssl_shutdown_timeout,
    )
    # no data may reach the TLS protocol before its connection_made
    transport.pause_reading()
    transport.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, transport)
    resumed = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resumed.cancel()
        raise
    app: asyncio.Transport = tls._app_transport
    return app


def _check_sendfile_params(file: Any, offset: Any, count: Any) -> None:
    # asyncio's own checks (BaseEventLoop._check_sendfile_params), same errors
    check_sendfile_file(file, count)
    if not isinstance(offset, int):
        raise TypeError(f"offset must be a non-negative integer (got {offset!r})")
    if offset < 0:
        raise ValueError(f"offset must be a non-negative integer (got {offset!r})")


def _regular_fileno(file: Any) -> int:
    """The fd of a regular file to read with ``os.preadv``, or -1."""
    try:
        fileno = file.fileno()
        st = os.fstat(fileno)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return -1
    return fileno if stat.S_ISREG(st.st_mode) else -1


async def sendfile(
    transport: asyncio.BaseTransport,
    file: Any,
    offset: int = 0,
    count: int | None = None,
    *,
    fallback: bool = True,
) -> int:
    """``loop.sendfile`` for an rsock transport (``rsock.patch()`` routes
    the loop's method here, on asyncio's loops and on uvloop).

    A regular file goes the native way: read from ``offset`` with
    ``os.preadv`` on the loop's thread (as ``os.sendfile`` runs on asyncio's
    native path), 256 KiB at a time into one buffer, each step copied into
    the connection's ring (the loop's own fallback for a transport without
    ``os.sendfile`` reads 16 KiB per step in a thread).  Anything else (a
    pipe, an ``io.BytesIO``) is read in the loop's executor with
    ``readinto``, if ``fallback`` allows (else
    ``asyncio.SendfileNotAvailableError``, as asyncio's loops raise).
    Returns the bytes sent; the file's position is then ``offset`` plus
    that, also after an error."""
    if not isinstance(transport, RsockTransport):
        raise TypeError(f"transport {transport!r} is not an rsock transport")
    if transport.is_closing():
        raise RuntimeError("Transport is closing")
    _check_sendfile_params(file, offset, count)
    fileno = _regular_fileno(file)
    if fileno < 0:
        if not fallback:  # what asyncio's native path raises then
            raise asyncio.SendfileNotAvailableError("not a regular file")
        return await _sendfile_read(transport, file, offset, count)
    return await transport._sendfile(fileno, offset, count)


async def _sendfile_read(
    transport: RsockTransport, file: Any, offset: int, count: int | None
) -> int:
    """sendfile of what has no fd to read at an offset: ``readinto`` in the
    loop's default executor (it may block), then ``write`` and wait for the
    queue to drain."""
    loop = asyncio.get_running_loop()
    if offset:
        file.seek(offset)
    size = _SENDFILE_CHUNK if count is None else min(count, _SENDFILE_CHUNK)
    buf = bytearray(size)
    total = 0
    try:
        while count is None or total < count:
            n = size if count is None else min(size, count - total)
            got = await loop.run_in_executor(None, file.readinto, memoryview(buf)[:n])
            if not got:
                break
            transport.write(bytes(buf[:got]))
            total += got
            await transport._drained()
    finally:
        if total and hasattr(file, "seek"):
            file.seek(offset + total)
    return total


async def start_server(
    client_connected_cb: Callable[
        [asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None] | None
    ],
    host: str | Iterable[str] | None = None,
    port: int | None = None,
    *,
    limit: int = 2**16,
    **kw: Any,
) -> RsockServer:
    """``asyncio.start_server`` for rsock: asyncio's own StreamReader/Writer."""
    loop = asyncio.get_running_loop()

    def factory() -> asyncio.StreamReaderProtocol:
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        return asyncio.StreamReaderProtocol(reader, client_connected_cb, loop=loop)

    return await create_server(factory, host, port, **kw)


async def open_connection(
    host: str | None = None, port: int | None = None, *, limit: int = 2**16, **kw: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` for rsock: asyncio's own StreamReader/Writer."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await create_connection(lambda: protocol, host, port, **kw)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer
