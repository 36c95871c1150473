"""``rsock.socket``: the stdlib ``socket.socket`` contract over the rsock engine.

Policy lives here, mechanism in C: the engine returns ``-errno`` and this
module turns it into exactly what the stdlib raises (``TimeoutError("timed
out")`` when a socket timeout expires, ``BlockingIOError`` in non-blocking
mode, EINTR retried as PEP 475 says, ``OSError(EBADF)`` on a closed socket).

Addresses are real: every rsock socket owns a kernel TCP socket that is
bound (never listening or connected) to reserve its ``(host, port)``, so
``bind`` errors, ``getsockname`` and port numbers are the kernel's own.  The
rendezvous of a listener is named after that address, scoped by the network
namespace (see ``native/src/cm_local.c``).

A socket object and its ``dup()``s share one ``_Core`` (the engine handle, the
reserving kernel socket and the connection state); the handle is closed when
the last of them closes.  ``makefile()`` defers the close like the stdlib.

Every blocking call goes through one helper (``_clock``, ``_attempt``,
``_fail``: the timeout, the deadline, EINTR and the one ``TimeoutError``).
Which way a connection goes is decided in ``rsock._paths``; a connection on
the plain TCP path is carried by ``rsock._tcp``'s path object; event loops
watch a connection through ``rsock._readiness.Watch`` (``socket.watch()``).
"""

from __future__ import annotations

import _socket as _ksocket
import errno as _errno
import io
import math
import operator
import os
import socket as _std
import stat
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self, cast

if TYPE_CHECKING:  # (typing_extensions costs ~2 MB at run time: a fork copies it)
    from typing_extensions import Buffer

from rsock import _lowlevel as _ll
from rsock import _paths
from rsock._paths import DEFAULT_OPTS, FALLBACK, VERBS_RING_SIZE, fallback_mode, provider_config
from rsock._readiness import Watch
from rsock._tcp import TcpPath, routed

_fast_send = _ll.fast_send
_fast_sendall = _ll.fast_sendall
_fast_recv_into = _ll.fast_recv_into
_fast_recv_bytes = _ll.fast_recv_bytes
_release = _ll.release
_WATCH_FD = _ll.WATCH_FD
_FAMILY_ENUM = {int(f): f for f in (_std.AF_INET, _std.AF_INET6)}  # (no enum call per socket)

__all__ = [
    "socket",
    "create_connection",
    "create_server",
    "has_dualstack_ipv6",
    "provider_config",
    "SOL_RSOCK",
    "RSOCK_RING_SIZE",
    "RSOCK_QDEPTH",
    "RSOCK_INLINE",
    "RSOCK_SPIN_US",
]

# rsock's own socket option level (like rsocket's SOL_RDMA): no kernel level
# has this number, so it can never be confused with one.
SOL_RSOCK = 0x5253  # "RS"
RSOCK_RING_SIZE = 1  # receive ring bytes (both rings, when set on the client)
RSOCK_QDEPTH = 2  # receive slots = message credits
RSOCK_INLINE = 3  # sends up to this size are posted inline
RSOCK_SPIN_US = 4  # busy-poll before sleeping (may change after connect)
_RSOCK_FIELDS = {
    RSOCK_RING_SIZE: "ring_size",
    RSOCK_QDEPTH: "qdepth",
    RSOCK_INLINE: "inline_max",
    RSOCK_SPIN_US: "spin_us",
}

# plain ints: IntFlag arithmetic costs microseconds per call
_MSG_PEEK = int(_std.MSG_PEEK)
_MSG_WAITALL = int(_std.MSG_WAITALL)
_MSG_DONTWAIT = int(_std.MSG_DONTWAIT)
_MSG_SUPPORTED = _MSG_PEEK | _MSG_WAITALL | _MSG_DONTWAIT | int(_std.MSG_NOSIGNAL)
_SOCK_NONBLOCK = getattr(_std, "SOCK_NONBLOCK", 0)
_SOCK_FLAGS = _SOCK_NONBLOCK | getattr(_std, "SOCK_CLOEXEC", 0)
_SOL_SOCKET = int(_std.SOL_SOCKET)
_SO_RCVBUF = int(_std.SO_RCVBUF)
_SO_SNDBUF = int(_std.SO_SNDBUF)
_SO_ERROR = int(_std.SO_ERROR)
_SO_LINGER = int(_std.SO_LINGER)
_SO_ACCEPTCONN = int(_std.SO_ACCEPTCONN)

# sendmsg: up to this many bytes in several buffers go out as one message
_COALESCE = 64 * 1024
# sendfile: bytes read from the file per send
_SENDFILE_BLOCK = 256 * 1024

# Errors a non-blocking connect reports later (SO_ERROR / the next connect),
# as TCP does for the outcome of its handshake; others are raised at once.
_ASYNC_CONNECT_ERRORS = (_errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EACCES)

# _Core.nb: where a non-blocking connect stands
_NB_DONE = 1  # reported EINPROGRESS but completed: the next connect() returns 0
_NB_FAILED = 2  # failed: SO_ERROR (once), then the next connect() reports it
_NB_PENDING = 3  # the listener's backlog was full: a thread waits to connect


# Who counts connections (rsock._patch while patched): called with
# "connect:<provider>", "accept:<provider>" or "refused:tcp", once per
# connection whatever the API that made it (blocking, non-blocking, asyncio).
tally: Callable[[str], None] | None = None
# fileno() of a connection made lazily: a stand-in fd until something polls
# it (socket._exact_fd), as rsock.patch() sets it: the patch hears of every
# poller first (select, poll, epoll, the loops' readers and writers), and an
# event loop that watches the connection's notify fd instead needs none
lazy_fd = False
# when a listener of this process last accepted an rsock connection
# (monotonic ns): a poller that watches a listener busy-polls for a while
# after it (rsock.patch's epoll), as more clients often follow
last_accept_ns = 0


def _tally(key: str) -> None:
    t = tally
    if t is not None:
        t(key)


_MAX_WAIT_MS = 2**31 - 1
_EINTR = -_errno.EINTR
_EAGAIN = -_errno.EAGAIN
_EAGAIN_MSG = os.strerror(_errno.EAGAIN)


def _clock(timeout: float | None) -> tuple[float | None, float | None]:
    """(timeout, deadline) for a call that starts now with this timeout
    (None: blocking, 0.0: non-blocking; both without a deadline)."""
    return timeout, (None if timeout is None or timeout == 0.0 else time.monotonic() + timeout)


def _expired(rc: int, timeout: float | None) -> bool:
    """Is rc an expired socket timeout (not non-blocking mode)?"""
    return rc in (-_errno.ETIMEDOUT, -_errno.EAGAIN) and bool(timeout)


def _timeout_error() -> TimeoutError:
    """What an expired socket timeout raises, as the stdlib's."""
    return TimeoutError("timed out")


def _timeout_ms(timeout: float | None, deadline: float | None) -> int:
    """Milliseconds for C: -1 forever, 0 non-blocking, else what is left."""
    if timeout is None:
        return -1
    if timeout == 0.0:
        return 0
    assert deadline is not None
    left = deadline - time.monotonic()
    if left <= 0:
        return 1  # expire in C, so data already there is still taken
    return _wait_ms(left)


def _wait_ms(timeout: float) -> int:
    """Milliseconds for C of a wait of ``timeout`` seconds (> 0) from now.
    C takes an int of milliseconds: one wait is cut to ~24.8 days (the
    stdlib takes any timeout; a wait that long ends as a timeout here)."""
    return min(max(1, math.ceil(timeout * 1000)), _MAX_WAIT_MS)


_monotonic = time.monotonic


def _not_int(v: object) -> str:
    return f"'{type(v).__name__}' object cannot be interpreted as an integer"


def _index(v: Any) -> int:
    """``int`` for an integer-like argument, the stdlib's TypeError otherwise."""
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(_not_int(v)) from None


_INT_MAX = 2**31 - 1
_SSIZE_MAX = 2**63 - 1
_LONG_MAX = 2**63 - 1  # a C long (LP64)


def _c_long(v: Any) -> int:
    """An int argument CPython converts to a C long, with its OverflowError."""
    n = _index(v)
    if not -_LONG_MAX - 1 <= n <= _LONG_MAX:
        raise OverflowError("Python int too large to convert to C long")
    return n


def _c_int(v: Any, arg: bool = False) -> int:
    """An int argument, with the OverflowError CPython raises converting it
    to a C int (arg: as an argument-tuple "i" field, which converts to a C
    long first: other messages)."""
    if type(v) is int and -_INT_MAX - 1 <= v <= _INT_MAX:
        return v
    n = _index(v)
    if -_INT_MAX - 1 <= n <= _INT_MAX:
        return n
    if not arg:
        raise OverflowError("Python int too large to convert to C int")
    _c_long(n)
    if n > 0:
        raise OverflowError("signed integer is greater than maximum")
    raise OverflowError("signed integer is less than minimum")


def _c_ssize(v: Any) -> int:
    """An int argument CPython converts to a Py_ssize_t ("n" field)."""
    n = _index(v)
    if not -_SSIZE_MAX - 1 <= n <= _SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return n


# how many callers of detach() _release_adopter looks at (the stdlib's
# SSLSocket._create, through a proxy's detach and rsock.SSLSocket.detach)
_ADOPTER_FRAMES = 6


def _release_adopter(fd: int) -> bool:
    """Undo the stdlib's adoption of our fileno before detach() refuses.

    ``ssl.SSLContext.wrap_socket()`` (and code written like it) builds
    ``socket.socket(fileno=sock.fileno())`` and only then calls
    ``sock.detach()``.  Given an rsock socket (directly, under a proxy
    object, or inside an rsock.SSLSocket), detach() must refuse, and that
    half-built stdlib socket would own the rsock fd: the garbage collector
    closes it, and rsock's close later closes whatever file took the number.
    So a stdlib socket object in the callers' frames that holds our fd lets
    go of it first (``_socket.socket.detach``: nothing is closed); the fd
    keeps its one owner.  Only a socket holding this very fd number is
    touched: any such object is an alias of rsock's fd.  True if one was."""
    released = False
    frame: Any = sys._getframe(2)  # detach()'s caller
    for _ in range(_ADOPTER_FRAMES):
        if frame is None:
            break
        for value in list(frame.f_locals.values()):
            if isinstance(value, _ksocket.socket) and value.fileno() == fd:
                _ksocket.socket.detach(value)
                released = True
        frame = frame.f_back
    return released


# open rsock sockets by fileno() (a dup shares its original's): which rsock
# socket a proxy object stands for (owner_of)
_live: weakref.WeakValueDictionary[int, socket] = weakref.WeakValueDictionary()
# fd -> weak reference, the dict the WeakValueDictionary keeps them in (CPython's
# weakref.py): a look at it costs no Python call
_live_refs: dict[int, weakref.ref[socket]] = _live.data  # type: ignore[attr-defined]


# fork() children this process is down the line of (bumped in each child)
_forks = 0


# serialises changes of a connection's watch bits (rare: a few per connection)
_watch_lock = threading.Lock()


def _count_fork() -> None:
    global _forks, _watch_lock
    _forks += 1
    _watch_lock = threading.Lock()  # (a thread that held it is not here)


os.register_at_fork(after_in_child=_count_fork)


def check_sendfile_file(file: Any, count: Any) -> None:
    """What the stdlib's sendfile (the socket's and asyncio's) checks of the
    file and the count, with its errors."""
    if "b" not in getattr(file, "mode", "b"):
        raise ValueError("file should be opened in binary mode")
    if count is not None:
        if not isinstance(count, int):
            raise TypeError(f"count must be a positive integer (got {count!r})")
        if count <= 0:
            raise ValueError(f"count must be a positive integer (got {count!r})")


def live(fd: int) -> socket | None:
    """The open rsock socket whose fileno() is ``fd`` (``_live.get``)."""
    r = _live_refs.get(fd)
    return None if r is None else r()


# how long bind() waits for the listener that holds a port's rendezvous name
# to hand it over (SO_REUSEPORT: its process answers in accept)
_JOIN_WAIT_MS = 3000


# rendezvous name -> the listener of this process that took it with
# SO_REUSEPORT (another of this process joins it directly: _join_here)
_reuse_holders: dict[bytes, weakref.ref[socket]] = {}


def _join_here(name: bytes) -> int:
    """A dup of the rendezvous socket a listener of this process holds for
    ``name`` with SO_REUSEPORT (shared from then on), or -1."""
    ref = _reuse_holders.get(name)
    holder = ref() if ref is not None else None
    if holder is None or holder._h is None or not holder._core.listening:
        return -1
    tcp = holder._core.tcp
    if tcp is None:
        return -1
    try:
        names = _paths.listen_names(holder._family, tcp)
        fds = _ll.listen_fds(holder._h)  # (shared from now on)
    except OSError:
        return -1
    holder._core.shared = True
    for n, fd in zip(names, fds, strict=False):
        if n == name:
            return os.dup(fd)
    return -1


def _reuseport(tcp: _std.socket) -> bool:
    opt = getattr(_std, "SO_REUSEPORT", None)
    return opt is not None and bool(tcp.getsockopt(_std.SOL_SOCKET, opt))


def owner_of(obj: Any) -> socket | None:
    """The open rsock socket whose ``fileno()`` ``obj.fileno()`` returns
    (obj being a proxy of it: an object that forwards to a socket), or None."""
    try:
        fd = obj.fileno()
    except Exception:
        return None
    if not isinstance(fd, int):
        return None
    sock = live(fd)
    h = sock._h if sock is not None else None
    if h is None or _ll.fileno(h) != fd:
        return None
    return sock


def _ebadf() -> OSError:
    return OSError(_errno.EBADF, "Bad file descriptor")


def ring_for_bufsize(value: int) -> int:
    """The ring size ``SO_RCVBUF``/``SO_SNDBUF`` = ``value`` asks for.

    Like the kernel, the value is taken as an unsigned 32-bit int and doubled;
    the ring is the next power of two at or above that, clamped to
    [RSK_RING_MIN, RSK_RING_MAX].  ``getsockopt`` then reports the ring size,
    which is exactly what Linux reports for a power of two between 2 KiB and
    ``net.core.rmem_max``.
    """
    v = (value & 0xFFFFFFFF) * 2
    v = min(max(v, _ll.RING_MIN), _ll.RING_MAX)
    return min(1 << (v - 1).bit_length(), _ll.RING_MAX)


def _opt_int(value: Any, optlen: int | None) -> int:
    """An int option value given to setsockopt the ways the stdlib accepts:
    an int, a bytes-like object holding a C int, or ``None`` with optlen."""
    if optlen is not None:
        # CPython tries (level, name, int), then (level, name, None, unsigned
        # int), then (level, name, buffer): what fails here fails the last
        try:
            if value is not None:
                raise TypeError
            n = operator.index(optlen) & 0xFFFFFFFF  # "I": no overflow check
        except TypeError:
            raise TypeError("setsockopt() takes exactly 3 arguments (4 given)") from None
        # the kernel takes optlen as an int and reads it from a NULL pointer
        err = _errno.EINVAL if n < 4 or n > _INT_MAX else _errno.EFAULT
        raise OSError(err, os.strerror(err))
    try:
        v = operator.index(value)
    except TypeError:
        pass
    else:
        if -_INT_MAX - 1 <= v <= _INT_MAX:
            return v
        # not a C int: CPython then takes it for a buffer, which it is not
        raise TypeError(f"a bytes-like object is required, not '{type(value).__name__}'")
    try:
        view = memoryview(value)
    except TypeError:
        raise TypeError(f"a bytes-like object is required, not '{type(value).__name__}'") from None
    raw = view.tobytes()
    if len(raw) < 4:
        raise OSError(_errno.EINVAL, "Invalid argument")
    return int.from_bytes(raw[:4], sys.byteorder, signed=True)


def _opt_result(v: int, buflen: int | None) -> int | bytes:
    if not buflen:
        return v  # buflen 0 too, as the stdlib
    if buflen < 0 or buflen > 1024:
        raise OSError("getsockopt buflen out of range")
    return v.to_bytes(4, sys.byteorder, signed=True)[:buflen]


# makefile()'s default read buffer (make_file)
READ_BUFFER = 65536


def make_file(
    sock: Any,
    mode: str,
    buffering: int | None,
    encoding: str | None,
    errors: str | None,
    newline: str | None,
) -> Any:
    """``socket.makefile`` for a socket-like object with ``_io_refs``: the
    stdlib's own ``SocketIO`` and buffered layers (shared by rsock.socket and
    rsock.SSLSocket)."""
    if not set(mode) <= {"r", "w", "b"}:
        raise ValueError(f"invalid mode {mode!r} (only r, w, b allowed)")
    writing = "w" in mode
    reading = "r" in mode or not writing
    binary = "b" in mode
    rawmode = ("r" if reading else "") + ("w" if writing else "")
    raw = _std.SocketIO(cast(Any, sock), cast(Any, rawmode))
    sock._io_refs += 1
    if buffering is None:
        buffering = -1
    default = buffering < 0
    if default:
        buffering = io.DEFAULT_BUFFER_SIZE
    if buffering == 0:
        if not binary:
            raise ValueError("unbuffered streams must be binary")
        return raw
    buffer: Any
    if reading and writing:
        buffer = io.BufferedRWPair(raw, raw, buffering)
    elif reading:
        # a reader's default buffer is larger than the stdlib's 8 KiB: every
        # read of the socket is a Python call here (a kernel socket's is C),
        # so a body read in 10 KiB pieces (http.client under requests)
        # costs 16 reads per MiB instead of 128 (README, differences)
        buffer = io.BufferedReader(raw, READ_BUFFER if default else buffering)
    else:
        buffer = io.BufferedWriter(raw, buffering)
    if binary:
        return buffer
    text = io.TextIOWrapper(buffer, io.text_encoding(encoding), errors, newline)
    text.mode = mode  # type: ignore[misc]
    return text


# Kernel socket options of rsock sockets that have no kernel socket (an
# unbound client, an accepted connection): each is set on a throwaway
# kernel socket of the family (so that it is checked as the kernel checks
# it: same exceptions), read back as the kernel stores it, and recorded on
# the rsock socket (_Core.kopts).  An option never set reads a throwaway
# socket's, which is the kernel's default.  (A shared scratch socket would
# save the socket() call, but would stay open for the life of the process.)
_KOPT_BUFLEN = 256
# on/off options that frameworks set on every connection (aiohttp, uvicorn,
# tornado: TCP_NODELAY; SO_KEEPALIVE): an int value is stored as the kernel
# stores it, 0 or 1, with no throwaway socket
_KOPT_FLAGS = frozenset(
    (level, name)
    for level, name in (
        (_std.IPPROTO_TCP, getattr(_std, "TCP_NODELAY", -1)),
        (_std.SOL_SOCKET, getattr(_std, "SO_KEEPALIVE", -1)),
        (_std.SOL_SOCKET, getattr(_std, "SO_REUSEADDR", -1)),
    )
    if name >= 0
)


# (family, level, option, int value) -> what a kernel socket read back after
# taking that value (None: write-only): an option every connection sets
# (trio's TCP_NOTSENT_LOWAT) costs a kernel socket once, not per connection.
# A value the kernel refused is not kept: it raises again, as the kernel would.
_kopt_memo: dict[tuple[int, int, int, int], bytes | None] = {}


def _kopt_set(
    family: int,
    kopts: dict[tuple[int, int], bytes],
    level: int,
    name: int,
    value: Any,
    optlen: int | None,
) -> None:
    if optlen is None and type(value) in (int, bool) and (level, name) in _KOPT_FLAGS:
        # (aiohttp sets TCP_NODELAY to True: a bool is an int to the kernel)
        if -(1 << 31) <= value < (1 << 31):  # else the stdlib's OverflowError, below
            kopts[(level, name)] = (1 if value else 0).to_bytes(4, sys.byteorder)
            return
    memo = (family, level, name, value) if optlen is None and type(value) is int else None
    if memo is not None and memo in _kopt_memo:
        raw = _kopt_memo[memo]
        if raw is not None:
            kopts[(level, name)] = raw
        return
    with _std.socket(family, _std.SOCK_STREAM) as k:
        if optlen is None:
            k.setsockopt(level, name, value)
        else:
            k.setsockopt(level, name, value, optlen)
        try:
            raw = kopts[(level, name)] = k.getsockopt(level, name, _KOPT_BUFLEN)
        except OSError:
            raw = None  # write-only: nothing to read back
    if memo is not None and len(_kopt_memo) < 256:
        _kopt_memo[memo] = raw


def _kopt_get(
    family: int, kopts: dict[tuple[int, int], bytes], level: int, name: int, buflen: int | None
) -> Any:
    raw = kopts.get((level, name))
    if raw is None or (buflen is not None and not 0 < buflen <= 1024):
        with _std.socket(family, _std.SOCK_STREAM) as k:
            if buflen is None:
                return k.getsockopt(level, name)
            return k.getsockopt(level, name, buflen)
    if buflen is None:
        return int.from_bytes(raw[:4].ljust(4, b"\0"), sys.byteorder, signed=True)
    return raw[:buflen]


class _Core:
    """What a socket and its ``dup()``s share: the engine handle, the kernel
    socket that reserves the address, and the connection state.  The handle
    is closed when the last socket object referring to it is closed.

    (No ``__slots__``: the immutable defaults are the class's, so that a new
    socket, made once per connection, sets only what it owns.)"""

    # the kernel socket that reserves a bound or listening address (or
    # carries the TCP path); made when first needed, never for an rsock
    # client that connects unbound or an accepted connection
    tcp: _std.socket | None = None
    connected = False
    listening = False
    bound = False
    peer: tuple[Any, ...] | None = None
    local: tuple[Any, ...] | None = None
    watch = 0  # _ll.WATCH_* bits turned on
    detail = ""
    so_error = 0  # a non-blocking connect's outcome, read by SO_ERROR
    nb = 0  # _NB_*: a non-blocking connect reported EINPROGRESS
    nb_done: threading.Event | None = None  # set when _NB_PENDING ends
    ring_set = False  # ring size chosen by SO_RCVBUF/SNDBUF
    shared = False  # rv (or the listener's fds) handed to another process
    # a listener's own address (getsockname of its kernel socket), read at
    # its first accept: it cannot change after listen()
    listen_addr: tuple[Any, ...] | None = None
    loop_fd = 0  # event-loop watches of fileno() (socket._loop_watches_fd)
    # a poller (select, poll, epoll) asked for fileno() exact (_exact_fd)
    polled_fd = False
    fd = -1  # fileno(), once made (the same number for the handle's life)
    forks = 0  # _forks when fileno() last asked the engine
    # fileno()'s O_NONBLOCK flag is off (made on: _fd_mode); one flag for
    # all dup()s, as a dup'd fd shares its file's
    fd_block = False
    # set_inheritable(True) on a listener: its kernel socket and
    # rendezvous fds are inherited too, as they are made (adopt_inherited)
    inheritable = False
    # bind() joined another listener's rendezvous socket (SO_REUSEPORT)
    joined = False

    def __init__(self, h: _ll.Handle, tcp: _std.socket | None) -> None:
        self.h = h
        self.refs = 1
        # run at the last close, before the engine closes the connection's
        # fds (an event loop's registrations of its notify fds go first: the
        # peer holds the same eventfd, so an epoll would keep reporting it)
        self.closers: list[Callable[[], None]] = []
        self.lock = threading.Lock()
        if tcp is not None:
            self.tcp = tcp
        # kernel options set while there is no kernel socket, as the kernel
        # reads them back (_kopt_set); given to it when it is made
        self.kopts: dict[tuple[int, int], bytes] = {}
        # ring sizes asked for with SO_RCVBUF / SO_SNDBUF (0: not set)
        self.bufreq = {_SO_RCVBUF: 0, _SO_SNDBUF: 0}
        # rendezvous fds bound ahead of listen() (a bound socket handed to
        # another process: _reduce_for_child), by name; listen() adopts them
        self.rv: dict[bytes, int] = {}

    def acquire(self) -> None:
        with self.lock:
            self.refs += 1

    def linger0(self) -> bool:
        """SO_LINGER set to {on, 0 s} (close() resets the connection)?"""
        raw = self.kopts.get((_SOL_SOCKET, _SO_LINGER))
        if raw is None and self.tcp is not None and self.connected:
            try:  # (set on the kernel socket that reserves the address)
                raw = self.tcp.getsockopt(_SOL_SOCKET, _SO_LINGER, 8)
            except OSError:
                return False
        return raw is not None and len(raw) >= 8 and raw[:4] != bytes(4) and raw[4:8] == bytes(4)

    def release(self) -> None:
        with self.lock:
            self.refs -= 1
            if self.refs > 0:
                return
            reset = self.connected and self.linger0()
            tcp, self.tcp = self.tcp, None
            self.connected = False
            rv, self.rv = self.rv, {}
            closers, self.closers = self.closers, []
        for closer in closers:
            closer()
        if reset:
            _ll.abort(self.h)  # SO_LINGER {1, 0}: a reset, as TCP's close sends
        _ll.close(self.h)
        for fd in rv.values():
            os.close(fd)
        if tcp is not None:
            tcp.close()


class socket:
    """A stream socket with the API of ``socket.socket`` (AF_INET/AF_INET6,
    SOCK_STREAM), carried by the rsock engine.  See the README for the
    deliberate differences."""

    _h: _ll.Handle | None
    _core: _Core
    # the TCP path (rsock._tcp), once the connection went that way: then
    # every method is the kernel socket's (the object stays this one)
    _tcp: TcpPath | None = None
    # set on the sockets an rsock.SSLSocket holds: an unclosed one is reported
    # by the SSLSocket's own ResourceWarning, as the stdlib names its SSLSocket
    _tls_owned = False
    # under rsock.patch(), the int trio's waits on this connection are
    # known by while it has no fileno() (negative; 0: none yet)
    _trio_key = 0

    def __init__(
        self,
        family: int = -1,
        type: int = -1,
        proto: int = -1,
        fileno: int | None = None,
    ) -> None:
        self._h = None  # __del__ must find it whatever fails below
        if fileno is not None:
            raise OSError(_errno.EOPNOTSUPP, "rsock.socket cannot adopt a kernel file descriptor")
        if family == -1:
            family = _std.AF_INET
        if type == -1:
            type = _std.SOCK_STREAM
        if proto == -1:
            proto = 0
        family, type, proto = _c_int(family), _c_int(type), _c_int(proto)
        if family not in (_std.AF_INET, _std.AF_INET6):
            raise OSError(_errno.EAFNOSUPPORT, "rsock supports AF_INET and AF_INET6 only")
        if type & ~_SOCK_FLAGS != _std.SOCK_STREAM:
            raise OSError(_errno.ESOCKTNOSUPPORT, "rsock supports SOCK_STREAM only")
        if proto not in (0, _std.IPPROTO_TCP):
            raise OSError(_errno.EPROTONOSUPPORT, "Protocol not supported")
        self._family = _FAMILY_ENUM[family]
        self._proto = proto
        self._provider_name, opts = provider_config()
        self._closed = False
        self._io_refs = 0
        self._timeout: float | None = 0.0 if type & _SOCK_NONBLOCK else _std.getdefaulttimeout()
        h = _ll.new()
        self._core = _Core(h, None)  # no kernel socket until one is needed
        self._h = h
        # (the engine's defaults are the new socket's already)
        rc = 0 if opts is DEFAULT_OPTS else _ll.set_opts(h, opts)
        if rc < 0:
            self.close()
            raise ValueError(f"bad rsock tunables {opts}: {os.strerror(-rc)}")

    def _init_from(self, other: socket, h: _ll.Handle, core: _Core) -> None:
        self._family = other._family
        self._proto = other._proto
        self._provider_name = other._provider_name
        self._closed = False
        self._io_refs = 0
        self._timeout = _std.getdefaulttimeout()
        self._core = core
        self._h = h

    @classmethod
    def _accepted(
        cls,
        parent: socket,
        h: _ll.Handle,
        peer: tuple[Any, ...],
        local: tuple[Any, ...],
        provider: str,
    ) -> socket:
        self = cls.__new__(cls)
        core = _Core(h, None)
        core.connected = True
        core.bound = True
        core.peer = peer
        core.local = local
        self._init_from(parent, h, core)
        if provider:
            self._provider_name = provider
        return self

    def _on_tcp(self, k: _std.socket) -> socket:
        """A new socket object on the TCP path, carried by kernel socket k
        (a plain TCP client accepted by this listener, or a dup)."""
        sock = socket.__new__(socket)
        sock._family = self._family
        sock._proto = self._proto
        sock._provider_name = "tcp"
        sock._closed = False
        sock._io_refs = 0
        sock._h = None
        sock._tcp = TcpPath(k)
        # the kernel's accept already applied the stdlib's timeout rule
        sock._timeout = k.gettimeout()
        return sock

    # ------------------------------------------------------------ basics

    @property
    def family(self) -> _std.AddressFamily:
        return self._family

    @property
    def type(self) -> _std.SocketKind:
        return _std.SOCK_STREAM

    @property
    def proto(self) -> int:
        return self._proto

    @property
    def timeout(self) -> float | None:
        """The timeout in seconds (None: blocking), like ``socket.timeout``."""
        return self._timeout

    @property
    def provider(self) -> str | None:
        """Which path the connection took ("shm", "verbs", "tcp"), None if not
        connected."""
        if self._tcp is not None:
            return self._tcp.provider
        return self._provider_name if self._h is not None and self._core.connected else None

    def _handle(self) -> _ll.Handle:
        h = self._h
        if h is None:
            raise _ebadf()
        return h

    def _raise(self, rc: int) -> OSError:
        h = self._h
        reset = rc in (-_errno.ECONNRESET, -_errno.ECONNREFUSED)
        return _ll.oserror(rc, _ll.detail(h) if h is not None and reset else "")

    def fileno(self) -> int:
        """A real pollable fd.  A connection's polls as a TCP socket's
        would: readable when data, EOF or an error is there, writable while
        a send would not block (kept exact from the first call on).  A
        listener's is readable while a connection is pending.  -1 once
        closed, like the stdlib.  A ``dup()`` shares it."""
        h = self._h
        if h is None:
            return -1 if self._tcp is None else self._tcp.fileno()
        core = self._core
        if not core.loop_fd and not core.watch & _WATCH_FD and not (lazy_fd and core.connected):
            self._watch(_WATCH_FD)
        fd = core.fd
        if fd < 0:
            fd = core.fd = _ll.fileno(h)  # made on first use, O_NONBLOCK
            core.forks = _forks
            if self._timeout is None:
                self._fd_mode()
        elif core.forks != _forks:
            # made before a fork, first asked for here since: the engine
            # follows a connection nobody claimed since the fork for this
            # process's watcher too (else its fd turned readable only
            # while the parent still held its copy)
            _ll.fileno(h)
            core.forks = _forks
        r = _live_refs.get(fd)
        if r is None or r() is not self:  # (cheaper than setting it again)
            _live[fd] = self
        return fd

    def _exact_fd(self) -> None:
        """Something is about to poll fileno() (``lazy_fd``: rsock.patch()
        hears of select, poll, epoll and the loops' waits first): kept exact
        from now on, also while an event loop or an epoll routes it (watches
        its notify fd: fileno() calls leave it lazy meanwhile)."""
        core = self._core
        if self._h is not None and not core.watch & _WATCH_FD:
            core.polled_fd = True
            self._set_watch(_WATCH_FD, 0, unpolled=True)

    def _fd_lazy(self) -> bool:
        """Is fileno() a connection's that nothing keeps exact (lazy_fd:
        nobody polls it)?"""
        core = self._core
        return self._h is not None and core.connected and not core.watch & _WATCH_FD

    def _fd_mode(self) -> None:
        """fileno()'s O_NONBLOCK flag as CPython keeps a socket's fd: off only
        while the socket blocks with no timeout (a timeout is enforced around
        non-blocking calls).  The engine reads it only on the way to waiting
        with no timeout: a flag someone else turned on through the fd (fcntl,
        as fakeredis's server does) makes the call raise BlockingIOError, as
        with a kernel socket."""
        core = self._core
        block = self._timeout is None
        h = self._h
        if core.fd >= 0 and core.fd_block != block and h is not None:
            if _ll.fd_blocking(h, block) < 0:
                return  # (closed underneath: the socket's calls say so)
            core.fd_block = block

    def _fileno_made(self) -> bool:
        """Has fileno() been asked for (or is the socket on the TCP path)?
        Nobody can poll one that has not."""
        return self._h is None or self._core.fd >= 0

    def _is_listener(self) -> bool:
        """Listening (on the rsock path)?"""
        return self._h is not None and self._core.listening

    def _loop_watches_fd(
        self, on: bool, now: bool = True, closer: Callable[[], None] | None = None
    ) -> bool:
        """An event loop watches this connection for its fileno()'s readers
        and writers (rsock.patch's add_reader), through the notify fd: the
        fd need not be kept exact meanwhile (no watcher-thread wake-ups,
        whatever fileno() calls come), and is again once none is left
        (``now`` False: from the next fileno() call on, for a socket about
        to be closed).  ``closer``: the watch's cleanup, run by the last
        close if the watch is still on then (before the engine closes the
        fds); turning off with it does nothing (False) if it is no longer
        registered (ended before, or the socket is closing)."""
        core = self._core
        if closer is not None:
            if on:
                core.closers.append(closer)
            else:
                try:
                    core.closers.remove(closer)
                except ValueError:
                    return False
        core.loop_fd += 1 if on else -1
        if on:
            self._unwatch(_ll.WATCH_FD)
        elif not core.loop_fd and now:
            self._watch(_ll.WATCH_FD)
        return True

    def _watch(self, mask: int) -> None:
        """Turn on the engine's exact readiness (``_ll.WATCH_*``)."""
        if self._core.watch & mask != mask:
            self._set_watch(mask, 0)

    def _unwatch(self, mask: int) -> None:
        """Turn off what ``_watch`` turned on."""
        if self._core.watch & mask:
            self._set_watch(0, mask)

    def _set_watch(self, on: int, off: int, unpolled: bool = False) -> None:
        """``core.watch`` shows a bit only once the engine has it: a thread
        that sees ``_WATCH_FD`` there goes on to make ``fileno()`` (the
        engine makes an exact socketpair, not a stand-in it would swap
        under pollers already waiting on it), and threads changing
        different bits at once lose none."""
        with _watch_lock:
            h = self._h
            core = self._core
            new = (core.watch | on) & ~off
            if h is not None and new != core.watch:
                _ll.set_watch(h, new | (_ll.WATCH_UNPOLLED if unpolled else 0))
                core.watch = new

    def watch(self, weak: bool = False) -> Watch:
        """For an event loop: the connection's notify and liveness fds,
        kept exact by the engine without a thread (``rsock._readiness``;
        what ``rsock.asyncio`` and ``rsock.patch()`` watch).  ``weak``: the
        watch does not keep this socket object alive (one kept by a table
        of the patch's, not by what waits on it)."""
        h = self._h
        if not weak:

            def is_open() -> bool:
                return h is not None and self._h is h

            return Watch(h, is_open, self._raise, self._watch, self._unwatch)
        ref = weakref.ref(self)

        def weak_is_open() -> bool:
            s = ref()
            return s is not None and h is not None and s._h is h

        def error(rc: int) -> OSError:
            s = ref()
            return s._raise(rc) if s is not None else _ll.oserror(rc)

        def watch_on(mask: int) -> None:
            s = ref()
            if s is not None:
                s._watch(mask)

        def watch_off(mask: int) -> None:
            s = ref()
            if s is not None:
                s._unwatch(mask)

        return Watch(h, weak_is_open, error, watch_on, watch_off)

    @routed
    def get_inheritable(self) -> bool:
        """Whether the pollable fd is inherited by child processes (it is
        not by default; a connection is unusable in a child anyway)."""
        return os.get_inheritable(self.fileno())

    @routed
    def set_inheritable(self, inheritable: bool) -> None:
        if inheritable:
            self._exact_fd()  # (what another process polls, we never hear of)
        os.set_inheritable(self.fileno(), inheritable)
        core = self._core
        if not core.connected and not core.nb and (inheritable or core.inheritable):
            # a listener (or one to be): a program that starts a child with
            # fileno() inherited (werkzeug's reloader, gunicorn's re-exec)
            # hands it the listener, so the fds behind fileno() go too
            # (set_inheritable(False) on one never made inheritable: nothing
            # to undo, and it is not shared for it)
            core.inheritable = inheritable
            self._inherit_fds()

    def _inherit_fds(self) -> None:
        """A listener's kernel socket and rendezvous fds are inherited as its
        fileno() is (set_inheritable): a child that adopts fileno() finds
        them (adopt_inherited); and from then on they are shared, so a close
        here does not shut the child's listener down."""
        core = self._core
        fds = list(core.rv.values())
        if core.listening and self._h is not None:
            fds += _ll.listen_fds(self._h)  # (shared from now on)
        if core.tcp is not None:
            fds.append(core.tcp.fileno())
        if core.fd >= 0:  # (listen() put another file on its number)
            fds.append(core.fd)
        core.shared = True
        for fd in fds:
            os.set_inheritable(fd, core.inheritable)

    def _fd_or_minus1(self) -> int:
        h = self._h
        try:
            return -1 if h is None else _ll.fileno(h)
        except OSError:
            return -1

    def __repr__(self) -> str:
        if self._tcp is not None:
            return self._tcp.repr(self._family)
        h = self._h
        closed = getattr(self, "_closed", False)
        s = (
            f"<rsock.socket{' [closed]' if closed else ''} "
            f"fd={self._fd_or_minus1()}, "
            f"family={self._family!s}, type={_std.SOCK_STREAM!s}, proto={self._proto}"
        )
        if not closed and h is not None:
            try:
                laddr = self.getsockname()
                if laddr:
                    s += f", laddr={laddr}"
            except OSError:
                pass
            core = self._core
            if core.peer is not None and core.connected:
                s += f", raddr={core.peer}"
            if core.connected:
                s += f", provider={self._provider_name!r}"
        return s + ">"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *args: object) -> None:
        if not self._closed:
            self.close()

    def __del__(self) -> None:
        if self._tcp is not None:
            if self._tcp.k is not None:
                if not self._tls_owned:
                    warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2, source=self)
                self._tcp.close()
        elif getattr(self, "_h", None) is not None:
            if not self._closed and not self._tls_owned:
                warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2, source=self)
            self._real_close()

    def __getstate__(self) -> None:
        raise TypeError(f"cannot pickle {self.__class__.__name__!r} object")

    def close(self) -> None:
        """Closes this socket object; the connection goes when the last
        ``dup()`` and the last ``makefile()`` file are closed too."""
        self._closed = True
        if self._io_refs <= 0:
            self._real_close()

    def _real_close(self) -> None:
        if self._tcp is not None:
            self._tcp.close()
            return
        h, self._h = self._h, None
        if h is not None:
            self._core.release()

    def _decref_socketios(self) -> None:
        # called by socket.SocketIO.close() (the raw layer of makefile())
        if self._io_refs > 0:
            self._io_refs -= 1
        if self._closed:
            self.close()

    def dup(self) -> socket:
        """A second socket object for the same connection (or listener); the
        connection closes when the last of them is closed.  Unlike the
        stdlib, both objects return the same ``fileno()``."""
        if self._tcp is not None:
            return self._on_tcp(self._tcp.kernel().dup())
        h = self._handle()
        core = self._core
        core.acquire()
        sock = type(self).__new__(type(self))
        sock._init_from(self, h, core)
        sock._timeout = self._timeout
        return sock

    def detach(self) -> int:
        """Not supported on an open socket: the connection lives in the rsock
        engine, not in a file descriptor that could be handed over, so this
        raises ``OSError(EOPNOTSUPP)`` and leaves the socket as it was.  On a
        closed socket it returns -1, like the stdlib.  (On the TCP path it
        is the kernel socket's, which hands its fd over.)"""
        if self._tcp is not None:
            return self._tcp.detach()
        h = self._h
        if h is None:
            self._closed = True
            return -1
        if _release_adopter(_ll.fileno(h)):
            raise OSError(
                _errno.EOPNOTSUPP,
                "rsock.socket.detach(): an rsock connection has no kernel socket to hand "
                "over, so a stdlib socket cannot take over its fileno() (the stdlib's "
                "SSLContext.wrap_socket() cannot wrap it, or a proxy of it: give the rsock "
                "socket itself to rsock.ssl_wrap_socket())",
            )
        raise OSError(
            _errno.EOPNOTSUPP,
            "rsock.socket.detach(): an rsock connection has no kernel socket to hand "
            "over; keep the socket object (or dup() it) instead",
        )

    def makefile(
        self,
        mode: str = "r",
        buffering: int | None = None,
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        """``socket.makefile``: the stdlib's own ``SocketIO`` and buffered
        layers over this socket; closing the socket is deferred until the
        files are closed too."""
        return make_file(self, mode, buffering, encoding, errors, newline)

    def take_kernel(self) -> _std.socket | None:
        """On the TCP path: hands the kernel socket over (to an event
        loop's own transport); this object is closed from now on and the
        caller owns the socket.  None for an rsock connection, which has
        no kernel socket."""
        if self._tcp is None:
            return None
        k = self._tcp.take()
        self._closed = True
        return k

    # ------------------------------------------------------------ timeouts

    def settimeout(self, value: float | None, /) -> None:
        if (
            type(value) is float
            and 0.0 <= value < 9e9
            and self._h is not None
            and self._tcp is None
        ):
            self._timeout = value  # (the common case, checked as below)
            if self._core.fd_block:
                self._fd_mode()
            return
        if self._tcp is not None:
            self._timeout = self._tcp.settimeout(value)
            return
        val: Any = value
        if val is None:
            t = None
        else:
            if isinstance(val, int | float):
                v = float(val)
            else:
                v = float(_index(val))
            if math.isnan(v):
                raise ValueError("Invalid value NaN (not a number)")
            # CPython keeps timeouts as int64 nanoseconds
            if isinstance(val, int) and not -(2**63) < val * 10**9 < 2**63:
                raise OverflowError("timestamp too large to convert to C _PyTime_t")
            if not -(2.0**63) <= v * 1e9 < 2.0**63:
                raise OverflowError("timestamp out of range for platform time_t")
            if v < 0:
                raise ValueError("Timeout value out of range")
            t = v
        self._handle()
        self._timeout = t
        if self._core.fd >= 0:
            self._fd_mode()

    def gettimeout(self) -> float | None:
        return self._timeout

    def setblocking(self, flag: bool, /) -> None:
        if self._tcp is not None:
            self._timeout = self._tcp.setblocking(flag)
            return
        block = _c_long(flag)
        self._handle()
        self._timeout = None if block else 0.0
        if self._core.fd >= 0:
            self._fd_mode()

    def getblocking(self) -> bool:
        return self._timeout != 0.0

    # The blocking-call helper (CPython's sock_call_ex, trio's
    # _nonblocking_helper): _clock() takes the timeout and deadline once per
    # call, _attempt() runs one engine call to completion across EINTR with
    # the time left, _fail() turns its -errno into the exception (the one
    # TimeoutError("timed out") of this module: _timeout_error()).  _call()
    # is the three together; loops that keep partial progress (sendall,
    # sendmsg, recvmsg_into) or that do more than one call (connect's names,
    # accept's TCP clients) use the pieces.

    def _clock(self) -> tuple[float | None, float | None]:
        """(timeout, deadline) as they stand when a call starts: the call
        keeps them, whatever settimeout() another thread makes meanwhile
        (as CPython's sock_call reads sock_timeout once)."""
        return _clock(self._timeout)

    @staticmethod
    def _attempt(
        fn: Any, h: _ll.Handle, args: tuple[Any, ...], timeout: float | None, deadline: float | None
    ) -> Any:
        """``fn(h, *args, ms)`` with ms the time left (-1: none, 0:
        non-blocking), again while it is interrupted (PEP 475: the signal
        handlers run on the loop's way back, and may raise); its result."""
        while True:
            r = fn(h, *args, _timeout_ms(timeout, deadline))
            if (r[0] if type(r) is tuple else r) != _EINTR:
                return r

    def _fail(self, rc: int, timeout: float | None, detail: bool = True) -> OSError:
        """The exception for an engine call's -errno: the socket timeout's
        ``TimeoutError`` if it expired, else the error (with the engine's
        detail for a reset or refusal unless ``detail`` is false)."""
        if rc == _EAGAIN and not timeout:  # non-blocking: the usual way (accept, recv)
            return BlockingIOError(_errno.EAGAIN, _EAGAIN_MSG)
        if _expired(rc, timeout):
            return _timeout_error()
        return self._raise(rc) if detail else _ll.oserror(rc)

    def _call(
        self, fn: Any, *args: Any, clock: tuple[float | None, float | None] | None = None
    ) -> int:
        """Runs ``fn(handle, *args, timeout_ms)`` with the stdlib's timeout
        and EINTR policy; returns its non-negative result.  ``clock``: the
        (timeout, deadline) of a call that began earlier (a hot path's
        first attempt was interrupted), else they start now."""
        h = self._handle()
        timeout, deadline = clock or self._clock()
        rc: int = self._attempt(fn, h, args, timeout, deadline)
        if rc >= 0:
            return rc
        raise self._fail(rc, timeout)

    # ------------------------------------------------------------ addresses

    def _reserve(self) -> _std.socket:
        """The kernel socket that reserves our address, made now if there is
        none yet (with the options set so far)."""
        core = self._core
        if core.tcp is None:
            if self._h is None:
                raise _ebadf()
            tcp = _std.socket(self._family, _std.SOCK_STREAM)
            try:
                for (level, name), raw in core.kopts.items():
                    tcp.setsockopt(level, name, raw)
            except BaseException:
                tcp.close()
                raise
            core.tcp = tcp
        return core.tcp

    @routed
    def bind(self, address: Any, /) -> None:
        core = self._core
        if self._h is None or core.connected or core.listening:
            self._resolve(address, "bind")  # the stdlib checks the address first
            self._handle()
            raise OSError(_errno.EINVAL, "Invalid argument")
        tcp = self._reserve()
        tcp.bind(address)
        core.bound = True
        self._bind_names(tcp)
        if core.inheritable:
            self._inherit_fds()

    def _bind_names(self, tcp: _std.socket) -> None:
        """Bind the rendezvous names now, as the kernel binds the port: a
        socket handed to other processes (fork, multiprocessing) before it
        listens is then one listener in all of them, whichever listen()s."""
        core = self._core
        for name in _paths.listen_names(self._family, tcp):
            if name in core.rv:
                continue
            fd = _ll.rendezvous_bind(name)
            for _ in range(3):
                if fd != -_errno.EADDRINUSE or not _reuseport(tcp):
                    break
                # SO_REUSEPORT: the kernel let our port join another
                # listener's, so ours joins its rendezvous socket (that
                # listener's process answers in accept), or binds the name
                # if it went meanwhile (-EAGAIN)
                fd = _join_here(name)
                if fd < 0:
                    fd = _ll.rendezvous_join(name, _JOIN_WAIT_MS)
                if fd >= 0:
                    core.shared = core.joined = True
                elif fd == -_errno.EAGAIN:
                    fd = _ll.rendezvous_bind(name)  # (and again, if taken again)
                else:
                    break  # refused, or no answer in time
            if fd < 0:
                raise _ll.oserror(-_errno.EADDRINUSE if fd == -_errno.EAGAIN else fd)
            core.rv[name] = fd

    @routed
    def getsockname(self) -> Any:
        self._handle()
        core = self._core
        if core.local is not None:
            return core.local
        if core.tcp is None:  # nothing bound
            return ("0.0.0.0", 0) if self._family == _std.AF_INET else ("::", 0, 0, 0)
        return core.tcp.getsockname()

    @routed
    def getpeername(self) -> Any:
        self._handle()
        core = self._core
        if core.peer is None or not core.connected:
            raise OSError(_errno.ENOTCONN, "Transport endpoint is not connected")
        return core.peer

    # ------------------------------------------------------------ options

    @routed
    def setsockopt(
        self, level: int, optname: int, value: Any, optlen: int | None = None, /
    ) -> None:
        """``socket.setsockopt``.  ``SO_RCVBUF``/``SO_SNDBUF`` size the rings
        (see ``ring_for_bufsize``; the client sizes both rings of a
        connection, so the larger of the two requests wins; after connect
        they are accepted and change nothing).  Level ``SOL_RSOCK`` sets the
        engine's tunables.  Every other option goes to the kernel socket that
        reserves the address: validated and read back as the kernel does,
        without effect on the rsock connection."""
        if type(level) is not int or type(optname) is not int:
            level, optname = _index(level), _index(optname)
        if level == SOL_RSOCK or (level == _SOL_SOCKET and optname in (_SO_RCVBUF, _SO_SNDBUF)):
            v = _opt_int(value, optlen)
            h = self._handle()
            core = self._core
            if level == SOL_RSOCK:
                self._set_rsock_opt(h, core, optname, v)
            elif not core.connected:
                core.ring_set = True
                core.bufreq[optname] = ring_for_bufsize(v)
                ring = max(core.bufreq.values())
                rc = _ll.set_opts(h, _ll.get_opts(h)._replace(ring_size=ring))
                if rc < 0:
                    raise _ll.oserror(rc)
            return
        if self._h is None:
            raise _ebadf()
        tcp = self._core.tcp
        if tcp is None:
            _kopt_set(self._family, self._core.kopts, level, optname, value, optlen)
        elif optlen is None:
            tcp.setsockopt(level, optname, value)
        else:
            tcp.setsockopt(level, optname, value, optlen)

    def _set_rsock_opt(self, h: _ll.Handle, core: _Core, optname: int, v: int) -> None:
        field = _RSOCK_FIELDS.get(optname)
        if field is None:
            raise OSError(_errno.ENOPROTOOPT, "Protocol not available")
        if v < 0:
            raise OSError(_errno.EINVAL, "Invalid argument")
        if optname == RSOCK_INLINE and core.connected and v != _ll.get_opts(h).inline_max:
            # the engine keeps the inline size it connected with
            raise OSError(_errno.EISCONN, "Transport endpoint is already connected")
        rc = _ll.set_opt(h, field, v)
        if rc < 0:
            raise _ll.oserror(rc)
        if optname == RSOCK_RING_SIZE:
            core.bufreq = {_SO_RCVBUF: 0, _SO_SNDBUF: 0}
            core.ring_set = True

    @routed
    def getsockopt(self, level: int, optname: int, buflen: int | None = None, /) -> Any:
        """``socket.getsockopt``; ``SO_RCVBUF``/``SO_SNDBUF`` report the ring
        size, ``SO_ERROR`` the outcome of a non-blocking connect or the
        engine's pending error, ``SOL_RSOCK`` the engine's tunables."""
        level, optname = _c_int(level, True), _c_int(optname, True)
        if buflen is not None:
            buflen = _c_int(buflen, True)
        h = self._handle()
        core = self._core
        if level == _SOL_SOCKET:
            if optname == _SO_ERROR:
                return _opt_result(self._so_error(h, core), buflen)
            if optname == _SO_ACCEPTCONN:
                return _opt_result(1 if core.listening else 0, buflen)
            if optname in (_SO_RCVBUF, _SO_SNDBUF):
                return _opt_result(_ll.get_opts(h).ring_size, buflen)
        elif level == SOL_RSOCK:
            field = _RSOCK_FIELDS.get(optname)
            if field is None:
                raise OSError(_errno.ENOPROTOOPT, "Protocol not available")
            return _opt_result(getattr(_ll.get_opts(h), field), buflen)
        return self._kernel_opt(level, optname, buflen)

    def _kernel_opt(self, level: int, optname: int, buflen: int | None) -> Any:
        """A kernel option's value, as the kernel socket reads it back."""
        tcp = self._core.tcp
        if tcp is None:
            return _kopt_get(self._family, self._core.kopts, level, optname, buflen)
        if buflen is None:
            return tcp.getsockopt(level, optname)
        return tcp.getsockopt(level, optname, buflen)

    def _so_error(self, h: _ll.Handle, core: _Core) -> int:
        if core.nb == _NB_PENDING:
            return 0  # still in progress, as TCP's while its SYN is unanswered
        err, core.so_error = core.so_error, 0
        taken = _ll.take_error(h)  # (after a refused connect: the fd's error too)
        return err or taken

    # ------------------------------------------------------------ server side

    def listen(self, backlog: int = -1, /) -> None:
        backlog = _c_int(backlog, True)
        if self._tcp is not None:
            self._tcp.listen(backlog)
            return
        h = self._handle()
        core = self._core
        if core.connected:
            raise OSError(_errno.EINVAL, "Invalid argument")
        if backlog < 0:
            backlog = min(_std.SOMAXCONN, 128)
        _paths.check_provider(self._provider_name)
        if core.listening:
            self._reserve().listen(backlog)
            return
        if self._provider_name == "tcp":
            self._become_tcp()
            self.listen(backlog)
            return
        tcp = self._reserve()
        if not core.bound:
            tcp.bind(("0.0.0.0", 0) if self._family == _std.AF_INET else ("::", 0))
            core.bound = True
        host, port = tcp.getsockname()[:2]
        for name in _paths.listen_names(self._family, tcp):
            fd = core.rv.pop(name, None)
            if fd is None:
                rc = _ll.listen(h, name, backlog)
            else:  # bound before (or in another process): listen on it
                rc = _ll.listen_adopt(h, fd, backlog, core.shared)
                if rc < 0:
                    os.close(fd)
            if rc < 0:
                raise _ll.oserror(rc)
        # remote RDMA clients (rdma_cm has its own port space: same number)
        if _paths.takes_verbs(self._provider_name):
            vfam, vhost = _paths.verbs_target(self._family, host)
            rc = _ll.listen_verbs(h, vfam, vhost, port, backlog)
            if rc == -_errno.EADDRINUSE and core.joined:
                pass  # SO_REUSEPORT: rdma_cm shares no port; RDMA clients reach the first
            elif rc < 0 and self._provider_name == "verbs":
                raise _ll.oserror(rc, _ll.detail(h))
        # plain TCP clients are served on the same port: the kernel listener
        # joins the pollable fd and accept() takes them from it
        tcp.listen(backlog)
        tcp.setblocking(False)
        rc = _ll.listen_fd(h, tcp.fileno())
        if rc < 0:
            raise _ll.oserror(rc)
        if _reuseport(tcp):  # (other listeners of the port may join ours)
            rc = _ll.listen_reuseport(h, True)
            if rc < 0:
                raise _ll.oserror(rc)
            for name in _paths.listen_names(self._family, tcp):
                _reuse_holders[name] = weakref.ref(self)
        core.listening = True
        if core.inheritable:
            self._inherit_fds()

    def accept(self) -> tuple[socket, Any]:
        r = self._accept(False)
        assert r is not None
        return r

    def _accept_nowait(self) -> tuple[socket, Any] | None:
        """``accept()`` that does not wait for an rsock client, whatever the
        timeout, and returns None where it would raise ``BlockingIOError``
        (an event loop's accept loop ends that way once per wake-up: no
        exception made).  On the TCP path the kernel socket's own timeout
        applies (rsock.asyncio's listeners are non-blocking)."""
        return self._accept(True)

    def _accept(self, nowait: bool) -> tuple[socket, Any] | None:
        if self._tcp is not None:
            try:
                conn, addr = self._tcp.kernel().accept()
            except BlockingIOError:
                if nowait:  # (with the socket's own timeout: non-blocking here)
                    return None
                raise
            _tally("accept:tcp")
            return self._on_tcp(conn), addr
        h = self._handle()
        if not self._core.listening:
            raise OSError(_errno.EINVAL, "Invalid argument")
        timeout, deadline = (0.0, None) if nowait else self._clock()
        while True:
            r = _ll.accept(h, _timeout_ms(timeout, deadline))
            if not isinstance(r, int):
                nh, peer, local, provider = r
                break
            rc = r
            if rc == _EINTR:
                continue  # again while interrupted (as _attempt: PEP 475)
            if rc == -_errno.EAGAIN and nowait:
                return None
            if rc == -_errno.EXDEV:
                # a plain TCP client on our port
                try:
                    conn, addr = self._reserve().accept()
                except (BlockingIOError, InterruptedError):
                    continue  # another thread took it
                if fallback_mode() == "strict":
                    # refused: the client sees a reset (SO_LINGER 0 sends RST)
                    conn.setsockopt(_std.SOL_SOCKET, _std.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                    conn.close()
                    _tally("refused:tcp")
                    continue
                _tally("accept:tcp")
                return self._on_tcp(conn), addr
            raise self._fail(rc, timeout, detail=False)
        global last_accept_ns
        last_accept_ns = time.monotonic_ns()
        mine = self._core.listen_addr
        if mine is None:
            mine = self._core.listen_addr = self._reserve().getsockname()
        peer, local = _paths.accepted_addrs(self._family, mine, peer, local)
        sock = socket._accepted(self, nh, peer, local, provider)
        _tally(f"accept:{sock._provider_name}")
        if _std.getdefaulttimeout() is None and self.gettimeout():
            sock.setblocking(True)
        return sock, peer

    # ------------------------------------------------------------ client side

    def _become_tcp(self) -> None:
        """From now on this object is on the TCP path: the reserving kernel
        socket carries the connection, with the stdlib's behaviour."""
        core = self._core
        k = self._reserve()
        with core.lock:
            core.tcp = None  # the kernel socket is ours alone now
        h, self._h = self._h, None
        if h is not None:
            core.release()
        k.settimeout(self._timeout)
        self._tcp = TcpPath(k)

    def _resolve(self, address: Any, what: str = "connect") -> tuple[Any, ...]:
        fam = "AF_INET" if self._family == _std.AF_INET else "AF_INET6"
        if not isinstance(address, tuple):
            raise TypeError(f"{what}(): {fam} address must be tuple, not {type(address).__name__}")
        if self._family == _std.AF_INET and len(address) != 2:
            raise TypeError("AF_INET address must be a pair (host, port)")
        if self._family == _std.AF_INET6 and not 2 <= len(address) <= 4:
            raise TypeError("AF_INET6 address must be a tuple (host, port[, flowinfo[, scopeid]])")
        host, port = address[0], address[1]
        if not isinstance(host, str | bytes | bytearray):
            raise TypeError(f"str, bytes or bytearray expected, not {type(host).__name__}")
        port = _index(port)
        if not 0 <= port <= 65535:
            raise OverflowError(f"{what}(): port must be 0-65535.")
        if host == "":
            host = "0.0.0.0" if self._family == _std.AF_INET else "::"
        elif host == "<broadcast>":
            host = "255.255.255.255"
        if isinstance(host, str):
            # a numeric address needs no resolver (getaddrinfo costs several
            # syscalls); anything else (names, "127.1", scopes) goes to it
            try:
                packed = _std.inet_pton(self._family, host)
            except (OSError, ValueError):
                pass
            else:
                if self._family == _std.AF_INET:
                    return (host, port)
                flow = _index(address[2]) if len(address) > 2 else 0
                scope = _index(address[3]) if len(address) > 3 else 0
                if flow == 0 and scope == 0:
                    return (_std.inet_ntop(self._family, packed), port, 0, 0)
        infos = _std.getaddrinfo(cast(Any, host), port, self._family, _std.SOCK_STREAM)
        return tuple(infos[0][4])

    def _dial(self, h: _ll.Handle, core: _Core, dst: tuple[Any, ...], timeout_ms: int) -> int:
        """One connect attempt to a resolved address: the rendezvous names for
        it, most specific first.  Returns the engine's result."""
        host = str(dst[0])
        way, src_ip = _paths.route(self._provider_name, self._family, host)
        if not way:
            core.detail = src_ip  # why not
            return -_errno.ECONNREFUSED
        fam = self._family
        if way == "verbs":
            if not core.bound and src_ip:
                self._reserve().bind((src_ip, 0) if fam == _std.AF_INET else (src_ip, 0, 0, 0))
                core.bound = True
            return self._dial_verbs(h, core, dst, timeout_ms)
        timeout, deadline = _clock(timeout_ms / 1000)
        names = _paths.client_names(fam, host, dst[1])
        if core.bound:  # bind() before connect: the kernel socket holds the port
            src = tuple(self._reserve().getsockname())
            rc = self._dial_names(h, names, src, dst, None, timeout, deadline)
        else:
            # the connection's own rendezvous name holds the port: no
            # kernel socket (see "Differences" in the README)
            ip = src_ip or ("127.0.0.1" if fam == _std.AF_INET else "::1")
            rc = -_errno.EADDRINUSE
            for _ in range(64):
                port = _paths.pick_port()
                src = (ip, port) if fam == _std.AF_INET else (ip, port, 0, 0)
                bound = _paths.port_name(fam, ip, port)
                rc = self._dial_names(h, names, src, dst, bound, timeout, deadline)
                if rc != -_errno.EADDRINUSE:
                    break
            if rc >= 0:
                core.local = src
        if rc >= 0:
            core.connected = True
            core.peer = dst if fam == _std.AF_INET6 else dst[:2]
            _tally(f"connect:{self._provider_name}")
        return rc

    def _dial_names(
        self,
        h: _ll.Handle,
        names: tuple[bytes, ...],
        src: tuple[Any, ...],
        dst: tuple[Any, ...],
        bound: bytes | None,
        timeout: float | None,
        deadline: float | None,
    ) -> int:
        """Tries the rendezvous names in turn (the next one only while the
        last refused): the engine's result."""
        rc = -_errno.ECONNREFUSED
        fam, addr = self._family, h.addr
        for name in names:
            while True:  # again while interrupted (as _attempt: PEP 475)
                ms = _timeout_ms(timeout, deadline)
                rc = _ll.fast_connect(addr, name, bound, fam, src, dst, ms)
                if rc != _EINTR:
                    break
            if rc != -_errno.ECONNREFUSED:
                break
        return rc

    def _dial_verbs(self, h: _ll.Handle, core: _Core, dst: tuple[Any, ...], timeout_ms: int) -> int:
        """Connects over rdma_cm.  Address and route resolution cannot be
        left half-done like a TCP SYN, so a non-blocking connect waits for
        them too (bounded: 10 s)."""
        vfam, vdst, flags = _paths.verbs_dst(self._family, dst)
        if not (core.ring_set or os.environ.get("RSOCK_RING_SIZE")):
            # registered memory is pinned: the smaller default
            o = _ll.get_opts(h)
            if o.ring_size != VERBS_RING_SIZE:
                rc = _ll.set_opts(h, o._replace(ring_size=VERBS_RING_SIZE))
                if rc < 0:
                    return rc
        timeout, deadline = _clock((timeout_ms or 10000) / 1000)
        args = (vfam, None, vdst, flags)
        rc = cast(int, self._attempt(_ll.connect_verbs, h, args, timeout, deadline))
        if rc >= 0:
            core.connected = True
            core.peer = dst if self._family == _std.AF_INET6 else dst[:2]
            self._provider_name = "verbs"
            _tally("connect:verbs")
            local, _ = _ll.conn_addrs(h)
            if local is not None:
                mine = self._reserve().getsockname()
                shown = _paths.dialed_local(self._family, dst, vfam, vdst, local, mine)
                if shown is not None:
                    core.local = shown
        else:
            core.detail = _ll.detail(h)
        return rc

    def _connect(self, address: Any, what: str = "connect") -> int:
        """connect() as a -errno code (0 when connected)."""
        dst = self._resolve(address, what)  # the stdlib checks (and resolves) it first
        h = self._handle()
        core = self._core
        if core.nb:
            return self._connect_again(h, core)
        if core.connected:
            return -_errno.EISCONN
        if core.listening:
            return -_errno.EINVAL
        _paths.check_provider(self._provider_name)
        if core.rv:  # bound names no listener will take (a client bound first)
            rv, core.rv = core.rv, {}
            for fd in rv.values():
                os.close(fd)
        core.detail = ""
        if self._provider_name == "tcp":
            return FALLBACK
        if self._timeout != 0.0:
            ms = _timeout_ms(*self._clock())
            rc = self._dial(h, core, dst, ms if ms >= 0 else self._give_up_ms())
            return self._fallback_or(rc)
        # Non-blocking: like TCP, "in progress"; the outcome is read with
        # getsockopt(SO_ERROR) or a second connect().  The engine's connect
        # completes at once from the listener's queue, so there is one.
        rc = self._fallback_or(self._dial(h, core, dst, 0))
        if rc == FALLBACK:
            return rc
        if rc >= 0:
            core.nb = _NB_DONE
        elif rc == -_errno.EAGAIN:
            self._dial_behind(h, core, dst)
        elif -rc in _ASYNC_CONNECT_ERRORS:
            core.nb, core.so_error = _NB_FAILED, -rc
            _ll.set_refused(h)
        else:
            return rc
        return -_errno.EINPROGRESS

    def _give_up_ms(self) -> int:
        """How long a connect with no timeout waits for a full backlog before
        ETIMEDOUT: as long as TCP retries its SYN (TCP_SYNCNT, read from
        the kernel socket that reserves the address, or set on this socket,
        else the kernel's default, tcp_syn_retries; 6 tries: 127 s)."""
        core = self._core
        n: int = 6
        try:
            if core.tcp is not None or (_std.IPPROTO_TCP, _std.TCP_SYNCNT) in core.kopts:
                n = int(self._kernel_opt(_std.IPPROTO_TCP, _std.TCP_SYNCNT, None))
            else:
                n = _paths.syn_retries()
        except (OSError, AttributeError):
            pass
        return ((1 << (n + 1)) - 1) * 1000

    def _dial_behind(self, h: _ll.Handle, core: _Core, dst: tuple[Any, ...]) -> None:
        """A non-blocking connect met a full backlog: a thread waits in the
        engine's connect (the kernel wakes it when accept() makes room) and
        the fd polls writable when it is done, as TCP's after the SYN-ACK."""
        core.nb, core.nb_done = _NB_PENDING, threading.Event()
        _ll.set_dialing(h, True)
        give_up = self._give_up_ms()
        done = core.nb_done

        def dial() -> None:
            try:
                rc = self._fallback_or(self._dial(h, core, dst, give_up))  # retries EINTR
                if rc == FALLBACK:
                    rc = -_errno.ECONNREFUSED  # TCP fallback: not behind a pending connect
                if rc >= 0:
                    core.nb = _NB_DONE
                else:
                    core.nb, core.so_error = _NB_FAILED, -rc
                    _ll.set_refused(h)
            finally:
                _ll.set_dialing(h, False)
                done.set()

        threading.Thread(target=dial, name="rsock-connect", daemon=True).start()

    def _fallback_or(self, rc: int) -> int:
        """No rsock listener answered: FALLBACK to plain TCP unless
        RSOCK_FALLBACK=never (then the refusal stands, with the reason)."""
        if rc != -_errno.ECONNREFUSED:
            return rc
        core = self._core
        why = _paths.refusal(core.detail)
        if why is None:
            return FALLBACK
        core.detail = why
        return rc

    def _connect_again(self, h: _ll.Handle, core: _Core) -> int:
        """connect() after a non-blocking one reported EINPROGRESS: what
        Linux TCP answers (0 once done, then EISCONN; the error once failed,
        ECONNABORTED if SO_ERROR already took it; EALREADY while pending)."""
        if core.nb == _NB_DONE:
            core.nb = 0
            return 0
        if core.nb == _NB_FAILED:
            err, core.so_error = core.so_error, 0
            core.nb = 0
            return -(err or _errno.ECONNABORTED)
        assert core.nb_done is not None
        if self._timeout == 0.0:
            return -_errno.EALREADY
        if not core.nb_done.wait(self._timeout):
            return -_errno.ETIMEDOUT
        return self._connect_again(h, core)

    @routed
    def connect(self, address: Any, /) -> None:
        rc = self._connect(address)
        if rc == FALLBACK:
            self._become_tcp()
            try:
                self.connect(address)
            except BlockingIOError:  # EINPROGRESS: a connection under way
                _tally("connect:tcp")
                raise
            _tally("connect:tcp")
            return
        if rc >= 0:
            return
        if _expired(rc, self._timeout):
            raise _timeout_error()
        if rc in (-_errno.EINPROGRESS, -_errno.EALREADY):
            raise _ll.oserror(rc)
        h = self._h
        raise _ll.oserror(rc, self._core.detail or (_ll.detail(h) if h is not None else ""))

    def _connected_at_once(self) -> bool:
        """After a non-blocking connect's EINPROGRESS: had it completed
        already?  Then the second connect() that would say so (0) is
        taken here, without the address checked again (an event loop's
        connect; on the TCP path, never)."""
        if self._tcp is not None or self._h is None:
            return False
        core = self._core
        if core.nb != _NB_DONE:
            return False
        core.nb = 0
        return True

    @routed
    def connect_ex(self, address: Any, /) -> int:
        try:
            rc = self._connect(address, "connect_ex")
        except OSError as e:
            if e.errno is None or isinstance(e, _std.gaierror):
                raise
            return e.errno
        if rc == FALLBACK:
            self._become_tcp()
            rc = self.connect_ex(address)
            if rc in (0, _errno.EINPROGRESS):
                _tally("connect:tcp")
            return rc
        return 0 if rc >= 0 else -rc

    # ------------------------------------------------------------ data

    @staticmethod
    def _flags(flags: int) -> int:
        if type(flags) is int and not flags:
            return 0
        flags = _c_int(flags, arg=True)  # None, floats: TypeError, as the stdlib
        if flags & ~_MSG_SUPPORTED:
            raise OSError(_errno.EOPNOTSUPP, "Operation not supported")
        f = 0
        if flags & _MSG_PEEK:
            f |= _ll.F_PEEK
        if flags & _MSG_WAITALL:
            f |= _ll.F_WAITALL
        if flags & _MSG_DONTWAIT:
            f |= _ll.F_DONTWAIT
        return f

    @staticmethod
    def _cbuf(data: Any, writable: bool = False, what: str = "") -> Any:
        try:
            return _ll.from_buffer(data, writable)
        except (TypeError, BufferError) as e:
            if writable and what:
                # the stdlib's "w*" argument, whatever is wrong with it
                name = "None" if data is None else type(data).__name__
                raise TypeError(
                    f"{what}() argument 1 must be read-write bytes-like object, not {name}"
                ) from None
            if writable and _read_only(data):
                raise TypeError(
                    f"argument must be read-write bytes-like object, not {type(data).__name__}"
                ) from None
            if isinstance(e, BufferError):
                raise  # not contiguous: as the stdlib
            raise TypeError(
                f"a bytes-like object is required, not '{type(data).__name__}'"
            ) from None

    # The hot paths of send, sendall, recv and recv_into: no flags, any
    # timeout (blocking, non-blocking or timed), one call into C.  An
    # interrupted timed call goes on the long way with the deadline it
    # had; anything odd goes the long way from the start, which raises
    # the stdlib's exception.

    def send(self, data: Buffer, flags: int = 0, /) -> int:
        h = self._h
        clock = None
        if h is not None and not flags and type(flags) is int:
            t = self._timeout
            start = 0.0 if not t else _monotonic()
            try:
                rc: int = _fast_send(h.addr, data, -1 if t is None else 0 if not t else _wait_ms(t))
            except (TypeError, BufferError):
                pass
            else:
                if rc >= 0:
                    return rc
                if rc != _EINTR:
                    # the engine reports an error once: never ask twice
                    raise self._fail(rc, t)
                if t:
                    clock = (t, start + t)
        elif self._tcp is not None:
            return self._tcp.kernel().send(data, flags)
        buf = self._cbuf(data)
        # (with a timeout: back once some bytes went, as a kernel socket's)
        f = self._flags(flags) | (_ll.F_PARTIAL if self._timeout else 0)
        try:
            return self._call(_ll.send, buf, len(buf), f, clock=clock)
        except BaseException:
            _release(buf)
            raise

    def sendall(self, data: Buffer, flags: int = 0, /) -> None:
        h = self._h
        if h is not None and not flags and type(flags) is int:
            # C sends everything or fails (or is interrupted, or times out)
            t = self._timeout
            start = 0.0 if not t else _monotonic()
            try:
                rc = _fast_sendall(h.addr, data, -1 if t is None else 0 if not t else _wait_ms(t))
            except (TypeError, BufferError):
                pass
            else:
                if rc is None:
                    return
                if rc < 0 and rc != _EINTR:
                    raise self._fail(rc, t)  # reported once: never ask twice
                # interrupted, or an error (or the timeout) stays pending
                # after a partial send: the long way resumes after rc bytes
                self._sendall(data, flags, max(rc, 0), (t, None if not t else start + t))
                return
        elif self._tcp is not None:
            return self._tcp.kernel().sendall(data, flags)
        self._sendall(data, flags, 0)

    def _sendall(
        self,
        data: Buffer,
        flags: int,
        done: int,
        clock: tuple[float | None, float | None] | None = None,
    ) -> None:
        buf = self._cbuf(data)
        try:
            self._sendall_buf(buf, flags, done, clock)
        except BaseException:
            _release(buf)
            raise

    def _sendall_buf(
        self,
        buf: Any,
        flags: int,
        done: int,
        clock: tuple[float | None, float | None] | None = None,
    ) -> None:
        f = self._flags(flags)
        n = len(buf)
        h = self._handle()
        timeout, deadline = clock or self._clock()
        while done < n or n == 0:
            rc = self._attempt(_ll.send, h, (buf + done, n - done, f), timeout, deadline)
            if rc < 0:
                raise self._fail(rc, timeout)
            done += rc
            if n == 0:
                return

    @routed
    def sendto(self, data: Buffer, flags_or_address: Any, address: Any = None, /) -> int:
        """``socket.sendto(data[, flags], address)``: on a connected stream
        socket the address is checked, then ignored, as Linux TCP does."""
        self._cbuf(data)
        if address is None:
            flags, address = 0, flags_or_address
        else:
            flags = _c_int(flags_or_address, True)
        self._resolve(address, "sendto")
        return self.send(data, flags)

    @routed
    def sendmsg(
        self,
        buffers: Iterable[Buffer],
        ancdata: Iterable[Any] = (),
        flags: int = 0,
        address: Any = None,
        /,
    ) -> int:
        """``socket.sendmsg``: gathers the buffers, in order, into the stream.
        Ancillary data is checked for shape and then dropped, as Linux TCP
        drops it (``SCM_RIGHTS`` included); an address is checked and
        ignored, as on a connected TCP socket.  Everything is validated
        before a byte is sent."""
        flags = _c_int(flags, True)
        if address is not None:
            self._resolve(address, "sendmsg")
        try:
            items = list(buffers)
        except TypeError:
            raise TypeError("sendmsg() argument 1 must be an iterable") from None
        bufs = [self._cbuf(b) for b in items]
        try:
            return self._sendmsg_bufs(bufs, items, ancdata, flags)
        except BaseException:
            _release(*bufs)
            raise

    def _sendmsg_bufs(
        self, bufs: list[Any], items: list[Any], ancdata: Iterable[Any], flags: int
    ) -> int:
        _check_ancdata(ancdata)
        f = self._flags(flags)
        h = self._handle()
        total = sum(len(b) for b in bufs)
        if len(bufs) == 1:
            return self._call(_ll.send, bufs[0], total, f)
        if total <= _COALESCE:
            one = self._cbuf(b"".join(cast(Iterable[bytes], items)))
            return self._call(_ll.send, one, total, f)
        timeout, deadline = self._clock()
        sent = 0
        for b in bufs:
            n = len(b)
            if n == 0:
                continue
            rc: int = self._attempt(_ll.send, h, (b, n, f), timeout, deadline)
            if rc < 0:
                if sent:
                    return sent  # like the kernel: what went, the error next time
                raise self._fail(rc, timeout)
            sent += rc
            if rc < n:
                return sent
        return sent

    def recv(self, bufsize: int, flags: int = 0, /) -> bytes:
        h = self._h
        clock = None
        if h is not None and not flags and type(flags) is int and type(bufsize) is int:
            if 0 < bufsize <= _SSIZE_MAX:
                t = self._timeout
                start = 0.0 if not t else _monotonic()
                r = _fast_recv_bytes(
                    h.addr, bufsize, -1 if t is None else 0 if not t else _wait_ms(t)
                )
                if isinstance(r, bytes):
                    return r
                if r != _EINTR:
                    raise self._fail(r, t)  # reported once: never ask twice
                if t:
                    clock = (t, start + t)
        elif self._tcp is not None:
            return self._tcp.kernel().recv(bufsize, flags)
        return self._recv(bufsize, flags, clock=clock)

    def _recv(
        self,
        bufsize: int,
        flags: int,
        what: str = "recv",
        clock: tuple[float | None, float | None] | None = None,
    ) -> bytes:
        bufsize = _c_ssize(bufsize)
        flags = _c_int(flags, True)  # both parsed before the sign is looked at
        if bufsize < 0:
            raise ValueError(f"negative buffersize in {what}")
        f = self._flags(flags)
        h = self._handle()
        if bufsize == 0 or f & _ll.F_WAITALL:
            buf = bytearray(bufsize)
            n = self._call(_ll.recv_into, _ll.from_buffer(buf, True), bufsize, f)
            return bytes(buf[:n])
        timeout, deadline = clock or self._clock()
        r = self._attempt(_ll.recv_bytes, h, (bufsize, f), timeout, deadline)
        if isinstance(r, bytes):
            return r
        raise self._fail(r, timeout)

    def recv_into(self, buffer: Buffer, nbytes: int = 0, flags: int = 0) -> int:
        h = self._h
        clock = None
        if h is not None and not flags and type(flags) is int:
            t = self._timeout
            start = 0.0 if not t else _monotonic()
            try:
                rc: int = _fast_recv_into(
                    h.addr, buffer, -1 if t is None else 0 if not t else _wait_ms(t), nbytes
                )
            except (TypeError, BufferError, ValueError, OverflowError):
                pass
            else:
                if rc >= 0:
                    return rc
                if rc != _EINTR:
                    raise self._fail(rc, t)  # reported once: never ask twice
                if t:
                    clock = (t, start + t)
        elif self._tcp is not None:
            return self._tcp.kernel().recv_into(buffer, nbytes, flags)
        return self._recv_into(buffer, nbytes, flags, clock=clock)

    def _recv_into(
        self,
        buffer: Buffer,
        nbytes: int,
        flags: int,
        what: str = "recv_into",
        clock: tuple[float | None, float | None] | None = None,
    ) -> int:
        buf = self._cbuf(buffer, True, what)
        try:
            # the stdlib's order: the arguments, then their values
            nbytes = _c_ssize(nbytes)
            flags = _c_int(flags, True)
            if nbytes < 0:
                raise ValueError(f"negative buffersize in {what}")
            size = len(buf)
            if nbytes == 0:
                nbytes = size
            elif nbytes > size:
                if what == "recvfrom_into":
                    raise ValueError("nbytes is greater than the length of the buffer")
                raise ValueError("buffer too small for requested bytes")
            return self._call(_ll.recv_into, buf, nbytes, self._flags(flags), clock=clock)
        except BaseException:
            _release(buf)
            raise

    @routed
    def recvfrom(self, bufsize: int, flags: int = 0, /) -> tuple[bytes, Any]:
        """``socket.recvfrom``: the address is None, as for a TCP socket."""
        return self._recv(bufsize, flags, "recvfrom"), None

    @routed
    def recvfrom_into(self, buffer: Buffer, nbytes: int = 0, flags: int = 0) -> tuple[int, Any]:
        """``socket.recvfrom_into``: the address is None, as for TCP."""
        return self._recv_into(buffer, nbytes, flags, "recvfrom_into"), None

    @routed
    def recvmsg(
        self, bufsize: int, ancbufsize: int = 0, flags: int = 0, /
    ) -> tuple[bytes, list[tuple[int, int, bytes]], int, Any]:
        """``socket.recvmsg``: ``(data, [], 0, None)``; a stream carries no
        ancillary data, message flags or address."""
        bufsize = _c_ssize(bufsize)
        ancbufsize = _c_ssize(ancbufsize)
        flags = _c_int(flags, True)
        if bufsize < 0:
            raise ValueError("negative buffer size in recvmsg()")
        _check_ancbufsize(ancbufsize)
        if bufsize == 0:
            self._wait_readable(self._flags(flags))
            return b"", [], 0, None
        return self._recv(bufsize, flags), [], 0, None

    @routed
    def recvmsg_into(
        self, buffers: Iterable[Buffer], ancbufsize: int = 0, flags: int = 0, /
    ) -> tuple[int, list[tuple[int, int, bytes]], int, Any]:
        """``socket.recvmsg_into``: scatters the stream into the buffers in
        order, like ``readv`` (waits for the first byte as ``recv`` does, then
        fills further buffers with what is already there; with
        ``MSG_WAITALL`` fills them all)."""
        msg = "recvmsg_into() argument 1 must be an iterable of single-segment read-write buffers"
        ancbufsize = _c_ssize(ancbufsize)
        flags = _c_int(flags, True)
        try:
            items = list(buffers)
            bufs = [_ll.from_buffer(b, True) for b in items]
        except (TypeError, BufferError):
            raise TypeError(msg) from None
        try:
            return self._recvmsg_into_bufs(bufs, ancbufsize, flags)
        except BaseException:
            _release(*bufs)
            raise

    def _recvmsg_into_bufs(
        self, bufs: list[Any], ancbufsize: int, flags: int
    ) -> tuple[int, list[tuple[int, int, bytes]], int, Any]:
        _check_ancbufsize(ancbufsize)
        f = self._flags(flags)
        h = self._handle()
        bufs = [b for b in bufs if len(b)]
        if not bufs:
            self._wait_readable(f)
            return 0, [], 0, None
        if len(bufs) == 1:
            return self._call(_ll.recv_into, bufs[0], len(bufs[0]), f), [], 0, None
        if f & _ll.F_PEEK:
            # a peek always starts at the head of the stream: peek it all, then scatter
            total = sum(len(b) for b in bufs)
            tmp = bytearray(total)
            got = self._call(_ll.recv_into, _ll.from_buffer(tmp, True), total, f)
            view, off = memoryview(tmp), 0
            for b in bufs:
                k = min(len(b), got - off)
                if k <= 0:
                    break
                _ll.memmove(b, view[off : off + k], k)
                off += k
            return got, [], 0, None
        waitall = bool(f & _ll.F_WAITALL)
        timeout, deadline = self._clock()
        got = 0
        for b in bufs:
            n = len(b)
            # readv: further buffers get what is already there (non-blocking)
            t = 0.0 if got and not waitall else timeout
            rc = self._attempt(_ll.recv_into, h, (b, n, f), t, deadline)
            if rc < 0:
                if got:
                    return got, [], 0, None
                raise self._fail(rc, timeout)
            got += rc
            if rc < n:
                break
        return got, [], 0, None

    def _wait_events(self, events: int, timeout: float | None) -> int:
        """Waits (``timeout`` seconds, None: forever) until the connection is
        ready for ``events`` (``POLLIN``/``POLLOUT``); its readiness then,
        0 if none came in time; a closed or failed one is ready for
        everything (a poller finds what is wrong when it calls)."""
        h = self._h
        if h is None:
            return _ll.POLLIN | _ll.POLLOUT | _ll.POLLERR
        timeout, deadline = _clock(timeout)
        rc: int = self._attempt(_ll.wait, h, (events,), timeout, deadline)
        return rc if rc >= 0 else _ll.POLLIN | _ll.POLLOUT | _ll.POLLERR

    def _wait_readable(self, f: int) -> None:
        """A zero-byte recvmsg: like CPython, wait until the socket is
        readable (data or EOF) under the socket's timeout."""
        h = self._handle()
        timeout, deadline = self._clock()
        nonblocking = timeout == 0.0 or f & _ll.F_DONTWAIT
        while True:
            t = 0.0 if nonblocking else timeout
            rc = self._attempt(_ll.wait, h, (_ll.POLLIN,), t, deadline)
            if rc < 0:
                raise self._raise(rc)
            if rc:
                return
            if nonblocking:
                raise BlockingIOError(_errno.EAGAIN, os.strerror(_errno.EAGAIN))
            if timeout is not None:
                raise _timeout_error()

    @routed
    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """``socket.sendfile``: a regular file is read with ``os.preadv`` from
        ``offset`` (absolute, as ``os.sendfile`` reads) into one reused buffer
        and sent (there is no kernel socket for ``os.sendfile``); any other
        binary file object goes through ``send()`` as in the stdlib's
        fallback.  Offsets and the final file position are the stdlib's;
        non-blocking sockets raise ``ValueError``."""
        try:
            return self._sendfile_use_sendfile(file, offset, count)
        except _std._GiveupOnSendfile:  # type: ignore[attr-defined]
            return self._sendfile_use_send(file, offset, count)

    def _check_sendfile_params(self, file: Any, offset: int, count: int | None) -> None:
        check_sendfile_file(file, count)

    @routed
    def _sendfile_use_sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """The stdlib's ``os.sendfile`` path, for a regular file: raises
        ``socket._GiveupOnSendfile`` for anything else, as the stdlib does."""
        self._check_sendfile_params(file, offset, count)
        self._handle()
        try:
            fileno = file.fileno()
        except (AttributeError, io.UnsupportedOperation) as err:
            raise _std._GiveupOnSendfile(err) from None  # type: ignore[attr-defined]
        try:
            st = os.fstat(fileno)
        except OSError as err:
            raise _std._GiveupOnSendfile(err) from None  # type: ignore[attr-defined]
        if not st.st_size:
            return 0  # an empty file, before anything else
        if self._timeout == 0.0:
            raise ValueError("non-blocking sockets are not supported")
        if not stat.S_ISREG(st.st_mode):
            raise _std._GiveupOnSendfile("not a regular file")  # type: ignore[attr-defined]
        if offset < 0:
            # os.sendfile's EINVAL, before anything went: the stdlib gives up
            # on this path, and the send() path's seek then raises it (preadv
            # would read -1 as "from the file's position")
            einval = OSError(_errno.EINVAL, os.strerror(_errno.EINVAL))
            raise _std._GiveupOnSendfile(einval)  # type: ignore[attr-defined]
        view = memoryview(bytearray(min(count, _SENDFILE_BLOCK) if count else _SENDFILE_BLOCK))

        def read(done: int, n: int) -> Any:
            return view[: os.preadv(fileno, [view[:n]], offset + done)]

        try:
            return self._send_from(read, len(view), count, file, offset)
        finally:
            view.release()

    @routed
    def _sendfile_use_send(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """The stdlib's ``send()`` path: reads the file object from
        ``offset`` (seeking only when one is given) and sends each chunk."""
        self._check_sendfile_params(file, offset, count)
        self._handle()
        if self._timeout == 0.0:
            raise ValueError("non-blocking sockets are not supported")
        if offset:
            file.seek(offset)
        block = min(count, _SENDFILE_BLOCK) if count else _SENDFILE_BLOCK
        readinto: Any = getattr(file, "readinto", None)
        chunk = memoryview(bytearray(block)) if readinto is not None else None

        def read(done: int, n: int) -> Any:
            if chunk is None:
                return memoryview(file.read(n))
            return chunk[: readinto(chunk[:n]) or 0]

        return self._send_from(read, block, count, file, offset)

    def _os_sendfile(self, in_fd: int, offset: int | None, count: int) -> int:
        """``os.sendfile(self.fileno(), in_fd, offset, count)`` (``rsock.patch()``
        routes it here; the kernel's would write into the fd behind
        ``fileno()``, not into the connection): reads ``in_fd`` with
        ``os.preadv`` from ``offset`` (or its file position, which then moves
        past what was sent) and sends, as the kernel's sendfile does on a
        socket: a socket that blocks with no timeout sends all ``count``
        bytes (or up to EOF); any other sends what fits now, and raises
        ``BlockingIOError`` if nothing does.  Returns the bytes sent (0 at
        EOF)."""
        h = self._handle()
        pos = os.lseek(in_fd, 0, os.SEEK_CUR) if offset is None else offset
        blocking = self._timeout is None
        buf = memoryview(bytearray(min(count, _SENDFILE_BLOCK)))
        total = 0
        try:
            while total < count:
                n = os.preadv(in_fd, [buf[: count - total]], pos + total)
                if not n:
                    break
                if blocking:
                    self.sendall(buf[:n])
                    total += n
                    continue
                rc = _fast_send(h.addr, buf[:n], 0)
                while rc == _EINTR:
                    rc = _fast_send(h.addr, buf[:n], 0)
                if rc < 0:
                    if total:
                        break  # the error comes with the next call, as the kernel's
                    raise self._fail(rc, None)
                total += rc
                if rc < n:
                    break
        finally:
            if offset is None and total:
                os.lseek(in_fd, pos + total, os.SEEK_SET)
        return total

    def _send_from(
        self, read: Callable[[int, int], Any], block: int, count: int | None, file: Any, offset: int
    ) -> int:
        """sendfile's loop: sends what ``read(sent so far, n)`` returns (empty
        at EOF) until ``count`` bytes or EOF, and leaves ``file`` at
        ``offset`` + bytes sent, as the stdlib does."""
        total = 0
        try:
            while True:
                if count:
                    block = min(count - total, block)
                    if block <= 0:
                        break
                data = read(total, block)
                if not data:
                    break  # EOF
                while data:
                    try:
                        sent = self.send(data)
                    except BlockingIOError:
                        continue
                    total += sent
                    data = data[sent:]
            return total
        finally:
            if total > 0 and hasattr(file, "seek"):
                file.seek(offset + total)

    @routed
    def shutdown(self, how: int, /) -> None:
        how = _c_int(how)
        h = self._handle()
        if how not in (_std.SHUT_RD, _std.SHUT_WR, _std.SHUT_RDWR):
            raise OSError(_errno.EINVAL, "Invalid argument")
        if not self._core.connected:
            raise OSError(_errno.ENOTCONN, "Transport endpoint is not connected")
        rc = _ll.shutdown(h, how)
        if rc < 0:
            raise _ll.oserror(rc)

    # ------------------------------------------------------------ rsock extras

    def stats(self) -> dict[str, int]:
        """Per-connection counters (bytes and messages each way, credit and
        ring-space stalls, notifications armed and sent, spins, sleeps;
        empty on the TCP path)."""
        if self._tcp is not None:
            self._tcp.kernel()
            return {}
        return _ll.stats(self._handle())

    def rsock_opts(self) -> dict[str, int]:
        """Ring size, queue depth, inline threshold and spin time in force
        (empty on the TCP path)."""
        if self._tcp is not None:
            self._tcp.kernel()
            return {}
        o = _ll.get_opts(self._handle())
        return {
            "ring_size": o.ring_size,
            "qdepth": o.qdepth,
            "inline_max": o.inline_max,
            "spin_us": o.spin_us,
        }


def _read_only(data: Any) -> bool:
    try:
        return memoryview(data).readonly
    except TypeError:
        return False


def _check_ancdata(ancdata: Any) -> None:
    """sendmsg's ancillary data: an iterable of (level, type, bytes-like)."""
    try:
        items = list(ancdata)
    except TypeError:
        raise TypeError("sendmsg() argument 2 must be an iterable") from None
    for item in items:
        try:
            level, kind, data = item
        except (TypeError, ValueError):
            raise TypeError(
                "[sendmsg() ancillary data items]() argument must be sequence of length 3"
            ) from None
        _c_int(level, True)
        _c_int(kind, True)
        try:
            memoryview(data)
        except TypeError:
            raise TypeError(
                f"a bytes-like object is required, not '{type(data).__name__}'"
            ) from None


def _check_ancbufsize(ancbufsize: Any) -> None:
    # a socklen_t, which CPython limits to INT_MAX
    if not 0 <= _c_ssize(ancbufsize) <= _INT_MAX:
        raise ValueError("invalid ancillary data buffer length")


_GLOBAL_DEFAULT_TIMEOUT: Any = _std._GLOBAL_DEFAULT_TIMEOUT  # type: ignore[attr-defined]


def create_connection(
    address: tuple[str | None, int],
    timeout: float | None | Any = _GLOBAL_DEFAULT_TIMEOUT,
    source_address: tuple[str, int] | None = None,
    *,
    all_errors: bool = False,
) -> socket:
    """``socket.create_connection`` for rsock sockets."""
    host, port = address
    errors: list[OSError] = []
    infos: Iterable[Any] = _std.getaddrinfo(host, port, 0, _std.SOCK_STREAM)
    for af, _kind, proto, _canon, sa in infos:
        sock = None
        try:
            sock = socket(af, _std.SOCK_STREAM, proto)
            if timeout is not _GLOBAL_DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sa)
            errors.clear()
            return sock
        except OSError as exc:
            errors.append(exc)
            if sock is not None:
                sock.close()
    if errors:
        if all_errors:
            raise ExceptionGroup("create_connection failed", errors)
        raise errors[0]
    raise OSError("getaddrinfo returns an empty list")


def has_dualstack_ipv6() -> bool:
    """``socket.has_dualstack_ipv6``: can an AF_INET6 listener also take
    IPv4 clients?  (rsock listeners can wherever the kernel's can.)"""
    if not _std.has_ipv6 or not hasattr(_std, "IPPROTO_IPV6") or not hasattr(_std, "IPV6_V6ONLY"):
        return False
    try:
        with _std.socket(_std.AF_INET6, _std.SOCK_STREAM) as sock:
            sock.setsockopt(_std.IPPROTO_IPV6, _std.IPV6_V6ONLY, 0)
            return True
    except OSError:
        return False


def create_server(
    address: tuple[str | None, int] | tuple[str | None, int, int, int],
    *,
    family: int = _std.AF_INET,
    backlog: int | None = None,
    reuse_port: bool = False,
    dualstack_ipv6: bool = False,
) -> socket:
    """``socket.create_server`` for rsock: a bound, listening rsock socket
    (``SO_REUSEADDR`` set; with ``dualstack_ipv6`` an AF_INET6 listener that
    also takes IPv4 clients)."""
    if reuse_port and not hasattr(_std, "SO_REUSEPORT"):
        raise ValueError("SO_REUSEPORT not supported on this platform")
    if dualstack_ipv6:
        if not has_dualstack_ipv6():
            raise ValueError("dualstack_ipv6 not supported on this platform")
        if family != _std.AF_INET6:
            raise ValueError("dualstack_ipv6 requires AF_INET6 family")
    sock = socket(family, _std.SOCK_STREAM)
    try:
        try:
            sock.setsockopt(_std.SOL_SOCKET, _std.SO_REUSEADDR, 1)
        except OSError:
            pass  # fail later on bind(), as the stdlib does
        if reuse_port:
            sock.setsockopt(_std.SOL_SOCKET, _std.SO_REUSEPORT, 1)
        if _std.has_ipv6 and family == _std.AF_INET6:
            sock.setsockopt(_std.IPPROTO_IPV6, _std.IPV6_V6ONLY, 0 if dualstack_ipv6 else 1)
        try:
            sock.bind(address)
        except OSError as err:
            msg = f"{err.strerror} (while attempting to bind on address {address!r})"
            raise OSError(err.errno, msg) from None
        if backlog is None:
            sock.listen()
        else:
            sock.listen(backlog)
        return sock
    except OSError:
        sock.close()
        raise


# ------------------------------------------------------- to a child process


def _reduce_for_child(sock: socket) -> tuple[Any, ...]:
    """How multiprocessing's pickler hands an rsock socket to a child
    process (a spawned or forkserver child, a Queue): a listening or bound
    socket, as uvicorn --workers and the stdlib's own examples do.

    A kernel socket goes over as its fd; the child's socket shares the
    parent's open file description and so the parent's listening queue.
    rsock does the same with the fds a listener has: the kernel TCP socket
    that reserves the port and the rendezvous sockets local clients connect
    to.  A socket only bound (not listening yet) binds its rendezvous names
    now, so that every process that receives it and calls listen() listens
    on the same sockets, where a second listener of its own would find the
    name taken.  A connection cannot go: it lives in this process's engine
    (README, differences)."""
    from multiprocessing import reduction

    if sock._tcp is not None:
        return sock._tcp.reduce()  # a kernel socket: it goes over as one
    h = sock._handle()
    core = sock._core
    if core.connected or core.nb:
        raise TypeError(
            "cannot pickle a connected rsock.socket: the connection lives in this "
            "process's engine (a listening or bound socket can be handed to a child)"
        )
    tcp = sock._reserve()
    rv: list[tuple[bytes, Any]] = []
    core.shared = True
    if tcp.getsockname()[1]:  # bound (by bind(), or by listen())
        names = _paths.listen_names(sock._family, tcp)
        if core.listening:
            fds = _ll.listen_fds(h)
            if len(fds) != len(names):
                raise TypeError(f"cannot pickle {sock!r}: its rendezvous names changed")
            pairs = list(zip(names, fds, strict=True))
        else:
            sock._bind_names(tcp)
            pairs = [(name, core.rv[name]) for name in names]
        rv = [(name, reduction.DupFd(fd)) for name, fd in pairs]
    state = (
        sock._family,
        sock.type,
        sock._proto,
        sock._timeout,
        _ll.get_opts(h),
        reduction.DupFd(tcp.fileno()),
        rv,
        core.listening,
    )
    return _rebuild_in_child, state


def _rebuild_in_child(
    family: int,
    type_: int,
    proto: int,
    timeout: float | None,
    opts: _ll.Opts | None,
    tcp_df: Any,
    rv: list[tuple[bytes, Any]],
    listening: bool,
) -> socket:
    return _shared_listener(
        family,
        type_,
        proto,
        timeout,
        opts,
        tcp_df.detach(),
        [(name, df.detach()) for name, df in rv],
        listening,
    )


def _shared_listener(
    family: int,
    type_: int,
    proto: int,
    timeout: float | None,
    opts: _ll.Opts | None,
    tcp_fd: int,
    rv: list[tuple[bytes, int]],
    listening: bool,
    fileno: int = -1,
) -> socket:
    """A socket on another process's listener (or bound socket): its kernel
    socket and rendezvous fds, which the new socket owns; ``fileno``, if
    given, becomes its fileno() (socket(fileno=...))."""
    try:
        sock = socket(family, type_, proto)
    except BaseException:
        for fd in (tcp_fd, *(fd for _, fd in rv)):
            os.close(fd)
        raise
    try:
        h = sock._handle()
        core = sock._core
        for name, fd in rv:
            core.rv[name] = fd
        if core.tcp is not None:
            core.tcp.close()
        core.tcp = None
        try:
            core.tcp = _std.socket(family, _std.SOCK_STREAM, 0, fileno=tcp_fd)
        except BaseException:
            os.close(tcp_fd)
            raise
        tcp = core.tcp
        if opts is not None:
            rc = _ll.set_opts(h, opts)
            if rc < 0:
                raise _ll.oserror(rc)
        core.bound = bool(tcp.getsockname()[1])
        core.shared = True
        if listening:
            sock.listen()
        if fileno >= 0:
            _ll.fileno_onto(h, fileno)
            core.fd = fileno
        sock.settimeout(timeout)
    except BaseException:
        sock.close()
        raise
    return sock


def _fdinfo_targets(fd: int) -> list[tuple[int, int]] | None:
    """The (fd, inode) pairs an epoll fd watches, as /proc lists them (the
    numbers they had where they were registered), or None: not an epoll."""
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[eventpoll]":
            return None
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            info = f.read().decode("ascii", "replace")
    except OSError:
        return None
    out = []
    for line in info.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] == "tfd:":
            ino = [w[4:] for w in words if w.startswith("ino:")]
            try:
                out.append((int(words[1]), int(ino[0], 16)))
            except (IndexError, ValueError):
                continue
    return out


def _listening_kind(fd: int, ino: int) -> tuple[str, Any] | None:
    """("rv", name) for an rsock rendezvous socket, ("tcp", family) for a
    kernel TCP listener, if fd is open here on inode ino and listening;
    else None."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode) or st.st_ino != ino:
        return None
    k = _ksocket.socket(fileno=os.dup(fd))
    try:
        if not k.getsockopt(_std.SOL_SOCKET, _std.SO_ACCEPTCONN):
            return None
        if k.family == _std.AF_UNIX and k.type == _std.SOCK_SEQPACKET:
            name = k.getsockname()
            if isinstance(name, bytes) and name.startswith(b"\0rsock/"):
                return "rv", name[1:]
        elif k.family in (_std.AF_INET, _std.AF_INET6) and k.type == _std.SOCK_STREAM:
            return "tcp", k.family
        return None
    finally:
        k.close()


def adopt_inherited(family: int, type_: int, proto: int, fileno: int) -> socket | None:
    """``socket(fileno=fd)`` where fd is the fileno() of a listener of the
    process that started this one, inherited with it (werkzeug's reloader
    hands its child the listener this way, gunicorn its re-exec'd master):
    a listener on the same kernel socket and rendezvous sockets, which the
    parent made inheritable with fileno() (set_inheritable); it owns fd,
    its fileno() from then on.  None when fd is no rsock listener's
    fileno(); OSError when it is one whose sockets did not come along."""
    targets = _fdinfo_targets(fileno)
    if not targets:
        return None
    kinds = [_listening_kind(fd, ino) for fd, ino in targets]
    tcp = [(fd, k[1]) for (fd, _), k in zip(targets, kinds, strict=True) if k and k[0] == "tcp"]
    rv = [(k[1], fd) for (fd, _), k in zip(targets, kinds, strict=True) if k and k[0] == "rv"]
    if len(tcp) != 1 or not rv:
        raise OSError(
            _errno.ENOTSOCK,
            f"Socket operation on non-socket: fd {fileno} is an epoll fd; if it is the "
            "fileno() of an rsock listener of the process that started this one, the "
            "sockets behind it did not come along: call set_inheritable(True) on it before "
            "starting the child (or hand the socket over with multiprocessing)",
        )
    # the family is the kernel socket's (gunicorn asks for AF_UNIX to learn
    # what an inherited fd is), and it says which names its listener has:
    # all of them came
    tcp_fd, family = tcp[0]
    probe = _std.socket(family, _std.SOCK_STREAM, 0, fileno=os.dup(tcp_fd))
    try:
        names = _paths.listen_names(family, probe)
    finally:
        probe.close()
    if sorted(names) != sorted(n for n, _ in rv):
        raise OSError(_errno.ENOTSOCK, f"fd {fileno}: an rsock listener's sockets do not match")
    return _shared_listener(
        family,
        type_ if type_ != -1 else _std.SOCK_STREAM,
        max(proto, 0),
        _std.getdefaulttimeout(),
        None,
        os.dup(tcp_fd),
        [(n, os.dup(fd)) for n, fd in rv],
        True,
        fileno,
    )


def _register_reducers() -> None:
    from multiprocessing import reduction

    reduction.register(socket, _reduce_for_child)


_register_reducers()
