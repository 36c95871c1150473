"""The only module that imports the cffi extension ``rsock._native``.

One thin function per ``rsk_*`` call: Python types in, ``int``/``bytes`` out.
C returns ``>= 0`` or ``-errno``; these helpers hand the raw code back so
that the socket layer can apply the stdlib's policy (timeouts, EINTR retry,
non-blocking mode) in one place; ``oserror`` builds the exception.
"""

from __future__ import annotations

import fcntl
import os
import resource
import signal
import socket as _stdsocket
import threading
from typing import Any, NamedTuple

try:
    from rsock import _fastcall
    from rsock._native import ffi, lib
except ImportError as _e:  # pragma: no cover - depends on how rsock was installed
    _here = os.path.dirname(os.path.abspath(__file__))
    raise ImportError(
        f"rsock's compiled extensions (_native, _fastcall) are not in {_here}: "
        "this is probably a source tree of rsock that shadows the installed package "
        "(it comes first on sys.path, e.g. as the current directory). Run from another "
        "directory, or build the tree in place with `make venv`."
    ) from _e

F_PEEK: int = lib.RSK_F_PEEK
F_WAITALL: int = lib.RSK_F_WAITALL
F_DONTWAIT: int = lib.RSK_F_DONTWAIT
F_PARTIAL: int = lib.RSK_F_PARTIAL
POLLIN: int = lib.RSK_POLLIN
POLLOUT: int = lib.RSK_POLLOUT
POLLERR: int = lib.RSK_POLLERR
POLLHUP: int = lib.RSK_POLLHUP
POLLRDHUP: int = lib.RSK_POLLRDHUP
PROTO_VERSION: int = lib.RSK_PROTO_VERSION
RING_MIN: int = lib.RSK_RING_MIN
RING_MAX: int = lib.RSK_RING_MAX
QDEPTH_MIN: int = lib.RSK_QDEPTH_MIN
QDEPTH_MAX: int = lib.RSK_QDEPTH_MAX
SPIN_MAX_US: int = lib.RSK_SPIN_MAX_US

STATS_FIELDS: tuple[str, ...] = (
    "tx_bytes",
    "rx_bytes",
    "tx_msgs",
    "rx_msgs",
    "tx_ctrl",
    "rx_ctrl",
    "credit_stalls",
    "space_stalls",
    "arms",
    "notifies_sent",
    "spins",
    "sleeps",
    "cq_polls",
    "completions",
)


class Opts(NamedTuple):
    ring_size: int
    qdepth: int
    inline_max: int
    spin_us: int


class Handle:
    """An owned ``rsk_sock *``, freed when the Handle goes (never while a
    call can still use it: every caller holds a reference).  The freeing is
    ``_fastcall.Owner``'s, not ``ffi.gc()``'s: in a reference cycle the
    garbage collector runs every finalizer first, in no set order, and an
    ``ffi.gc()`` object has one; an unclosed socket's ``__del__`` then
    closed a freed connection (a hang or a crash at exit, or at any
    collection of such a cycle)."""

    __slots__ = ("ptr", "addr", "_owner")

    def __init__(self, ptr: Any, addr: int | None = None) -> None:
        self.ptr = ptr
        # the same pointer as an int, for rsock._fastcall
        self.addr: int = int(ffi.cast("uintptr_t", ptr)) if addr is None else addr
        self._owner = _fastcall.Owner(self.addr)


def oserror(rc: int, detail: str = "") -> OSError:
    """``OSError`` for ``-errno`` (CPython picks the PEP 3151 subclass)."""
    err = -rc
    msg = os.strerror(err)
    if detail:
        msg = f"{msg} ({detail})"
    return OSError(err, msg)


# The signal wakeup fd that rsock gives Python (see rsk_set_signal_fd):
# None until the main thread makes its first socket; then (read, write) of
# our pipe, or () when Python already had a wakeup fd (it is left alone).
_wakeup: tuple[int, ...] | None = None


def _fd_high(fd: int) -> int:
    """fd moved up as the engine moves its own long-lived fds
    (prov_fd_high): out of the low numbers a program counts on."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    base = 256 if soft == resource.RLIM_INFINITY else min(256, soft // 2)
    if fd >= base:
        return fd
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base)
    except OSError:
        return fd
    os.close(fd)
    return high


def _install_wakeup() -> None:
    """Give Python a signal wakeup fd whose read end the engine watches,
    so that a main thread blocked in rsock runs its signal handlers at once
    even while it busy-polls.  Only where none is set (an event loop that
    sets its own, asyncio's add_signal_handler, replaces it; the engine's
    sleeps still end on the signal itself then)."""
    global _wakeup
    if threading.current_thread() is not threading.main_thread():
        return  # set_wakeup_fd works in the main thread only: later
    r, w = (_fd_high(fd) for fd in os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC))
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        old = -2
    if old != -1:
        if old >= 0:
            signal.set_wakeup_fd(old)  # somebody's own: theirs stays
        os.close(r)
        os.close(w)
        _wakeup = ()
        return
    _wakeup = (r, w)
    lib.rsk_set_signal_pipe(r, w)


def hide_wakeup() -> bool:
    """Takes rsock's pipe off Python's signal wakeup fd, if it is there
    (trio checks that none is set before it sets its own, and warns of a
    collision otherwise); True if it was.  :func:`show_wakeup` puts it back."""
    if not _wakeup or threading.current_thread() is not threading.main_thread():
        return False
    old = signal.set_wakeup_fd(-1)
    if old == _wakeup[1]:
        return True
    signal.set_wakeup_fd(old)  # somebody's own: theirs stays
    return False


def show_wakeup() -> None:
    """rsock's pipe is Python's signal wakeup fd again, unless somebody set
    another meanwhile."""
    if not _wakeup or threading.current_thread() is not threading.main_thread():
        return
    old = signal.set_wakeup_fd(_wakeup[1], warn_on_full_buffer=False)
    if old not in (-1, _wakeup[1]):
        signal.set_wakeup_fd(old)  # somebody's own: theirs stays


# A fork child gets a pipe of its own on the same two numbers, made by the
# engine inside fork() (rsk_set_signal_pipe): no after-fork hook here.


# glibc's malloc serves a block of at least its mmap threshold (128 KiB at
# first) with its own mmap, and when such a block is freed it raises the
# threshold to that block's size and the heap's trim threshold to twice it
# (mallopt(3): M_MMAP_THRESHOLD, "dynamic").  A program receiving 1 MiB
# messages learns a threshold of ~1 MiB from its first joined body, and then
# holds ~2 MiB at the heap's top per message (the chunks and their join):
# right at the trim threshold, so depending on where other objects happen to
# sit, the heap was trimmed and grown again around every message (aiohttp's
# client: 10 brk and ~560 page faults per MiB; 0.31-0.48x TCP).  rsock hands
# the receiver a ring's worth at once (TCP's arrive a segment at a time), so
# it teaches the allocator a larger size before its first connection: one
# block allocated and freed untouched (calloc maps zero pages: no page is
# touched).  16 MiB (trim at 32): httpx's responses are freed by the cyclic
# GC, ~20 bodies at a time, which 4 MiB did not cover (uvicorn+httpx 1 MiB:
# 250 page faults per request with 4 MiB, ~0 with 16).  The cost: a process
# keeps up to 32 MiB of freed heap instead of returning it.  A user's own
# MALLOC_*_ environment or mallopt() turns glibc's dynamic thresholds off,
# and then this does nothing; so does another libc.
HEAP_HINT = 16 << 20
_heap_hinted = False


def hint_heap() -> None:
    global _heap_hinted
    _heap_hinted = True
    bytes(HEAP_HINT)  # freed at once: glibc's threshold 16 MiB, its trim threshold 32


def new() -> Handle:
    if _wakeup is None:
        _install_wakeup()
    if not _heap_hinted:
        hint_heap()
    addr = _fastcall.socket()
    if addr < 0:
        raise oserror(addr)
    return Handle(ffi.cast("rsk_sock *", addr), addr)


def fileno(h: Handle) -> int:
    """The socket's pollable fd, made on first use (OSError: EMFILE...)."""
    rc = int(lib.rsk_fileno(h.ptr))
    if rc < 0:
        raise oserror(rc)
    return rc


def fd_blocking(h: Handle, blocking: bool) -> int:
    """fileno()'s O_NONBLOCK flag as the socket's mode (rsk_fd_blocking)."""
    return int(lib.rsk_fd_blocking(h.ptr, 1 if blocking else 0))


def fileno_onto(h: Handle, fd: int) -> None:
    """The pollable fd moves onto ``fd``'s number (socket(fileno=fd))."""
    rc = int(lib.rsk_fileno_onto(h.ptr, fd))
    if rc < 0:
        raise oserror(rc)


WATCH_NOTIFY: int = lib.RSK_WATCH_NOTIFY
WATCH_FD: int = lib.RSK_WATCH_FD
WATCH_UNPOLLED: int = lib.RSK_WATCH_UNPOLLED  # with WATCH_FD: nobody polls fileno() yet


def set_watch(h: Handle, mask: int) -> int:
    """What stays exact between calls: WATCH_FD (``fileno()`` polls like a
    TCP socket, through the engine's watcher thread) and/or WATCH_NOTIFY
    (the notify fd is readable while the socket is ready for the events of
    ``set_interest``: what an event loop watches)."""
    return int(lib.rsk_set_watch(h.ptr, mask))


def default_opts() -> Opts:
    o = ffi.new("struct rsk_opts *")
    lib.rsk_opts_default(o)
    return Opts(o.ring_size, o.qdepth, o.inline_max, o.spin_us)


def get_opts(h: Handle) -> Opts:
    o = ffi.new("struct rsk_opts *")
    lib.rsk_get_opts(h.ptr, o)
    return Opts(o.ring_size, o.qdepth, o.inline_max, o.spin_us)


def set_opts(h: Handle, opts: Opts) -> int:
    o = ffi.new("struct rsk_opts *")
    o.ring_size = opts.ring_size
    o.qdepth = opts.qdepth
    o.inline_max = opts.inline_max
    o.spin_us = opts.spin_us
    return int(lib.rsk_set_opts(h.ptr, o))


def set_opt(h: Handle, field: str, value: int) -> int:
    """One of rsk_opts' fields set, the others as they are (no Opts made)."""
    o = ffi.new("struct rsk_opts *")
    lib.rsk_get_opts(h.ptr, o)
    setattr(o, field, value)
    return int(lib.rsk_set_opts(h.ptr, o))


def detail(h: Handle) -> str:
    return str(ffi.string(lib.rsk_detail(h.ptr)).decode("utf-8", "replace"))


def _fill_addr(a: Any, family: int, host: str, port: int, flowinfo: int, scope: int) -> None:
    a.family = family
    a.port = port
    a.flowinfo = flowinfo
    a.scope_id = scope
    packed = _stdsocket.inet_pton(family, host)
    ffi.memmove(a.addr, packed, len(packed))


def _read_addr(a: Any) -> tuple[int, tuple[Any, ...]] | None:
    """The address a peer announced, or None if it is not a valid one."""
    fam = int(a.family)
    if fam == _stdsocket.AF_INET:
        host = _stdsocket.inet_ntop(fam, bytes(ffi.buffer(a.addr, 4)))
        return fam, (host, int(a.port))
    if fam == _stdsocket.AF_INET6:
        host = _stdsocket.inet_ntop(fam, bytes(ffi.buffer(a.addr, 16)))
        return fam, (host, int(a.port), int(a.flowinfo), int(a.scope_id))
    return None


def listen(h: Handle, name: bytes, backlog: int) -> int:
    return int(lib.rsk_listen(h.ptr, name, len(name), backlog))


VF_LOOPBACK4 = int(lib.RSK_VF_LOOPBACK4)
VF_LOOPBACK6 = int(lib.RSK_VF_LOOPBACK6)


def trim() -> int:
    """Drops the shared-memory arenas no connection of this process uses
    (rsk_trim): how many went."""
    return int(lib.rsk_trim())


def verbs_probe() -> tuple[int, str]:
    """(number of RDMA devices, or -errno; one sentence saying so)."""
    buf = ffi.new("char[]", 200)
    rc = int(lib.rsk_verbs_probe(buf, 200))
    return rc, str(ffi.string(buf).decode("utf-8", "replace"))


def listen_verbs(h: Handle, family: int, host: str, port: int, backlog: int) -> int:
    a = ffi.new("struct rsk_addr *")
    _fill_addr(a, family, host, port, 0, 0)
    return int(lib.rsk_listen_verbs(h.ptr, a, backlog))


def connect_verbs(
    h: Handle,
    family: int,
    src: tuple[Any, ...] | None,
    dst: tuple[Any, ...],
    flags: int,
    timeout_ms: int,
) -> int:
    d = ffi.new("struct rsk_addr *")
    _fill_addr(d, family, dst[0], dst[1], *(dst[2:4] if len(dst) >= 4 else (0, 0)))
    s = ffi.NULL
    if src is not None:
        s = ffi.new("struct rsk_addr *")
        _fill_addr(s, family, src[0], src[1], *(src[2:4] if len(src) >= 4 else (0, 0)))
    return int(lib.rsk_connect_verbs(h.ptr, s, d, flags, timeout_ms))


def conn_addrs(h: Handle) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
    """(local, peer) as the connection manager saw them."""
    a = ffi.new("struct rsk_addr *")
    b = ffi.new("struct rsk_addr *")
    if lib.rsk_addrs(h.ptr, a, b) < 0:
        return None, None
    la, pa = _read_addr(a), _read_addr(b)
    return (la[1] if la else None), (pa[1] if pa else None)


Accepted = tuple[Handle, "tuple[Any, ...] | None", "tuple[Any, ...] | None", str]


def accept(h: Handle, timeout_ms: int) -> int | Accepted:
    """rsk_accept's -errno, or (handle, peer address, local address the
    peer dialed, provider); each address None if the peer announced no
    valid one."""
    r = _fastcall.accept(h.addr, timeout_ms)
    if isinstance(r, int):
        return r
    _, addr, peer, local, provider = r
    return Handle(ffi.cast("rsk_sock *", addr), addr), peer, local, provider


def send(h: Handle, data: Any, nbytes: int, flags: int, timeout_ms: int) -> int:
    return int(lib.rsk_send(h.ptr, data, nbytes, flags, timeout_ms))


def recv_into(h: Handle, buf: Any, nbytes: int, flags: int, timeout_ms: int) -> int:
    return int(lib.rsk_recv(h.ptr, buf, nbytes, flags, timeout_ms))


def recv_bytes(h: Handle, nbytes: int, flags: int, timeout_ms: int) -> bytes | int:
    """Bytes copied once, straight out of the ring; or a -errno int."""
    out = ffi.new("const void **")  # (C writes it only on success)
    rc = lib.rsk_recv_zc(h.ptr, nbytes, flags, timeout_ms, out)
    if rc <= 0:
        return b"" if rc == 0 else int(rc)
    try:
        data: bytes = ffi.unpack(ffi.cast("const char *", out[0]), rc)
    except BaseException:
        lib.rsk_recv_done(h.ptr, 0)
        raise
    lib.rsk_recv_done(h.ptr, 0 if flags & F_PEEK else rc)
    return data


# ffi.from_buffer's arguments go positionally: a keyword argument costs a
# dict per call (about 0.5 µs, as much as a whole small recv)
CHARS: Any = ffi.typeof("char[]")


def from_buffer(data: Any, writable: bool = False) -> Any:
    return ffi.from_buffer(CHARS, data, writable)


def memmove(dst: Any, src: Any, n: int) -> None:
    """Copies n bytes between cffi buffers / bytes-like objects."""
    ffi.memmove(dst, src, n)


# The hot paths of the socket layer and the asyncio transport (send,
# sendall, recv_into): rsk_send/rsk_recv through the buffer protocol
# (rsock._fastcall), with Handle.addr, a bytes-like object and a timeout;
# the result is rsk_*'s.  Through cffi the same call costs about 0.4 µs
# more (argument conversion, ffi.from_buffer), as much as the engine's own
# work on a small message.
_fastcall.bind(
    *(int(ffi.cast("uintptr_t", ffi.addressof(lib, f)))
      for f in ("rsk_send", "rsk_recv", "rsk_recv_zc", "rsk_recv_done", "rsk_free",
                "rsk_accept", "rsk_connect_bound", "rsk_socket", "rsk_provider"))
)  # fmt: skip
fast_send = _fastcall.send
fast_sendall = _fastcall.sendall
fast_recv_into = _fastcall.recv_into
fast_recv_bytes = _fastcall.recv_bytes  # readable bytes (up to n) as one bytes object
# Local connect (Handle.addr, rendezvous name, the name that holds src's port
# meanwhile or None, family, src, dst, timeout_ms): the addresses numeric
# (resolved), as the socket module's tuples; -EADDRINUSE: bound is taken
fast_connect = _fastcall.connect


def release(*bufs: Any) -> None:
    """Releases cffi buffers (from_buffer) now.  Called when an exception
    leaves a method: its traceback keeps the frames, and a buffer still
    exported from a memoryview slice kept alive in a reference cycle crashes
    CPython 3.11 at exit (CPython issue #77894)."""
    for b in bufs:
        if b is not None:
            try:
                ffi.release(b)
            except (TypeError, ValueError):
                pass


def shutdown(h: Handle, how: int) -> int:
    return int(lib.rsk_shutdown(h.ptr, how))


def poll(h: Handle) -> int:
    return int(lib.rsk_poll(h.ptr))


def wait(h: Handle, events: int, timeout_ms: int) -> int:
    return int(lib.rsk_wait(h.ptr, events, timeout_ms))


def take_error(h: Handle) -> int:
    return int(lib.rsk_take_error(h.ptr))


def stats(h: Handle) -> dict[str, int]:
    st = ffi.new("struct rsk_stats *")
    lib.rsk_stats(h.ptr, st)
    return {f: int(getattr(st, f)) for f in STATS_FIELDS}


def close(h: Handle) -> int:
    return int(lib.rsk_close(h.ptr))


def abort(h: Handle) -> int:
    """Reset the connection before ``close`` (SO_LINGER {1, 0})."""
    return int(lib.rsk_abort(h.ptr))


def set_interest(h: Handle, events: int) -> int:
    """What makes the watched fd readable: POLLIN and/or POLLOUT."""
    return int(lib.rsk_set_interest(h.ptr, events))


def set_polled(h: Handle, on: bool) -> int:
    """Polling mode on or off (rsk_set_polled): while on, the notify fd is
    neither armed nor kept exact; the caller polls with ``SpinSet``."""
    return int(lib.rsk_set_polled(h.ptr, 1 if on else 0))


class SpinSet:
    """Connections an event loop polls (``rsk_spin_ready``): a C array of
    their handles, made for one membership (the handles are kept alive)."""

    __slots__ = ("_handles", "_v", "_out", "_n")

    def __init__(self, handles: list[Handle]) -> None:
        self._handles = handles
        self._n = len(handles)
        self._v = ffi.new("rsk_sock *[]", [h.ptr for h in handles] or 1)
        self._out = ffi.new("int[]", self._n or 1)

    def spin(self, budget_us: int) -> list[int]:
        """Indexes of the connections ready within ``budget_us`` (busy-polls
        that long at most, the GIL released), ``[]`` if none."""
        k = lib.rsk_spin_ready(self._v, self._n, budget_us, self._out)
        if k <= 0:
            if k < 0:
                raise oserror(k)
            return []
        out = self._out
        return [out[i] for i in range(k)]


def set_dialing(h: Handle, on: bool) -> int:
    """A connect goes on in another thread: the fd does not poll writable."""
    return int(lib.rsk_set_dialing(h.ptr, 1 if on else 0))


def set_refused(h: Handle) -> int:
    """A non-blocking connect failed: the fd polls as a refused TCP socket's."""
    return int(lib.rsk_set_refused(h.ptr))


def listen_fd(h: Handle, fd: int) -> int:
    """A kernel listening fd joins the listener (rsk_accept then says -EXDEV)."""
    return int(lib.rsk_listen_fd(h.ptr, fd))


def notify_fds(h: Handle) -> tuple[int, int]:
    """(notify fd, liveness fd) behind a connection's pollable fd."""
    n = ffi.new("int[2]")
    rc = lib.rsk_notify_fds(h.ptr, n, n + 1)
    if rc < 0:
        raise oserror(rc)
    return int(n[0]), int(n[1])


def check_peer(h: Handle) -> int:
    """The liveness fd fired: 1 if the peer is gone, 0 if not, or -errno."""
    return int(lib.rsk_check_peer(h.ptr))


def rendezvous_bind(name: bytes) -> int:
    """A new fd bound to the rendezvous name, not listening yet (or -errno)."""
    return int(lib.rsk_rendezvous_bind(name, len(name)))


def rendezvous_join(name: bytes, timeout_ms: int) -> int:
    """The rendezvous socket bound to ``name`` from the listener of our uid
    that holds it and allows joining (SO_REUSEPORT), or -errno."""
    return int(lib.rsk_rendezvous_join(name, len(name), timeout_ms))


def listen_reuseport(h: Handle, on: bool) -> int:
    """The listener answers JOINs (SO_REUSEPORT)."""
    return int(lib.rsk_listen_reuseport(h.ptr, 1 if on else 0))


def listen_adopt(h: Handle, fd: int, backlog: int, shared: bool) -> int:
    """The bound rendezvous fd listens and joins h (h owns it on success);
    shared: other processes hold it too."""
    return int(lib.rsk_listen_adopt(h.ptr, fd, backlog, 1 if shared else 0))


def listen_fds(h: Handle) -> list[int]:
    """A listener's rendezvous fds (still h's)."""
    fds = ffi.new("int[8]")
    rc = int(lib.rsk_listen_fds(h.ptr, fds, 8))
    if rc < 0:
        raise oserror(rc)
    return [int(fds[i]) for i in range(min(rc, 8))]
