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
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import math
import os
import socket as _std
import time
import warnings
from collections.abc import Iterable
from typing import Any, Self

from typing_extensions import Buffer

from rsock import _lowlevel as _ll

_raw_send = _ll.raw_send
_raw_recv = _ll.raw_recv
_raw_from_buffer = _ll.raw_from_buffer

__all__ = ["socket", "create_connection", "provider_config"]

# plain ints: IntFlag arithmetic costs microseconds per call
_MSG_PEEK = int(_std.MSG_PEEK)
_MSG_WAITALL = int(_std.MSG_WAITALL)
_MSG_DONTWAIT = int(_std.MSG_DONTWAIT)
_MSG_SUPPORTED = _MSG_PEEK | _MSG_WAITALL | _MSG_DONTWAIT | int(_std.MSG_NOSIGNAL)
_SOCK_FLAGS = getattr(_std, "SOCK_NONBLOCK", 0) | getattr(_std, "SOCK_CLOEXEC", 0)


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v, 0)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not an integer") from None


def provider_config() -> tuple[str, _ll.Opts]:
    """The provider and tunables new sockets get, read from the environment
    (``RSOCK_PROVIDER``, ``RSOCK_RING_SIZE``, ``RSOCK_QDEPTH``,
    ``RSOCK_INLINE``, ``RSOCK_SPIN_US``)."""
    d = _ll.default_opts()
    opts = _ll.Opts(
        ring_size=_env_int("RSOCK_RING_SIZE", d.ring_size),
        qdepth=_env_int("RSOCK_QDEPTH", d.qdepth),
        inline_max=_env_int("RSOCK_INLINE", d.inline_max),
        spin_us=_env_int("RSOCK_SPIN_US", d.spin_us),
    )
    return os.environ.get("RSOCK_PROVIDER", "") or "shm", opts


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
    return max(1, math.ceil(left * 1000))


def _not_int(v: object) -> str:
    return f"'{type(v).__name__}' object cannot be interpreted as an integer"


def _names(family: int, host: str, port: int) -> list[bytes]:
    """Rendezvous names a client tries for (host, port), most specific first."""
    tag = "4" if family == _std.AF_INET else "6"
    names = [f"rsock/{tag}/{host}/{port}".encode()]
    wild = "0.0.0.0" if family == _std.AF_INET else "::"
    if host != wild:
        names.append(f"rsock/{tag}/{wild}/{port}".encode())
    return names


def _is_local(family: int, host: str) -> tuple[bool, str]:
    """Is host an address of this host (this network namespace)?  Also the
    source address the kernel would use to reach it."""
    try:
        with _std.socket(family, _std.SOCK_DGRAM) as u:
            u.connect((host, 9))
            src = str(u.getsockname()[0])
    except OSError:
        return False, ""
    ip = ipaddress.ip_address(host.split("%")[0])
    return ip.is_loopback or src == host, src


class socket:
    """A stream socket with the API of ``socket.socket`` (AF_INET/AF_INET6,
    SOCK_STREAM), carried by the rsock engine.  See the README for the
    deliberate differences."""

    _h: _ll.Handle | None

    def __init__(
        self,
        family: int = -1,
        type: int = -1,
        proto: int = -1,
        fileno: int | None = None,
    ) -> None:
        if fileno is not None:
            raise OSError(
                _errno.EOPNOTSUPP, "rsock.socket cannot adopt a kernel file descriptor"
            )
        if family == -1:
            family = _std.AF_INET
        if type == -1:
            type = _std.SOCK_STREAM
        if proto == -1:
            proto = 0
        if family not in (_std.AF_INET, _std.AF_INET6):
            raise OSError(_errno.EAFNOSUPPORT, "rsock supports AF_INET and AF_INET6 only")
        if type & ~_SOCK_FLAGS != _std.SOCK_STREAM:
            raise OSError(_errno.ESOCKTNOSUPPORT, "rsock supports SOCK_STREAM only")
        if proto not in (0, _std.IPPROTO_TCP):
            raise OSError(_errno.EPROTONOSUPPORT, "Protocol not supported")
        self._family = _std.AddressFamily(family)
        self._proto = proto
        self._provider_name, opts = provider_config()
        # the kernel socket that reserves our address (never listens)
        self._tcp: _std.socket | None = _std.socket(family, _std.SOCK_STREAM)
        self._h = _ll.new()
        rc = _ll.set_opts(self._h, opts)
        if rc < 0:
            self.close()
            raise ValueError(f"bad rsock tunables {opts}: {os.strerror(-rc)}")
        self._connected = False
        self._listening = False
        self._bound = False
        self._peer: tuple[Any, ...] | None = None
        self._local: tuple[Any, ...] | None = None
        self._closed = False
        self._watch = False
        self._detail = ""
        dt = _std.getdefaulttimeout()
        self._timeout: float | None = dt
        if type & getattr(_std, "SOCK_NONBLOCK", 0):
            self._timeout = 0.0

    @classmethod
    def _accepted(
        cls, parent: socket, h: _ll.Handle, peer: tuple[Any, ...], local: tuple[Any, ...]
    ) -> socket:
        self = cls.__new__(cls)
        self._family = parent._family
        self._proto = parent._proto
        self._provider_name = parent._provider_name
        self._tcp = None
        self._h = h
        self._connected = True
        self._listening = False
        self._bound = True
        self._peer = peer
        self._local = local
        self._closed = False
        self._watch = False
        self._detail = ""
        self._timeout = _std.getdefaulttimeout()
        return self

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
    def provider(self) -> str | None:
        """Which path the connection took ("shm"), None if not connected."""
        return self._provider_name if self._connected else None

    def _handle(self) -> _ll.Handle:
        h = self._h
        if h is None:
            raise OSError(_errno.EBADF, "Bad file descriptor")
        return h

    def _raise(self, rc: int) -> OSError:
        h = self._h
        reset = rc in (-_errno.ECONNRESET, -_errno.ECONNREFUSED)
        return _ll.oserror(rc, _ll.detail(h) if h is not None and reset else "")

    def fileno(self) -> int:
        """A real pollable fd (an epoll fd over the engine's notification
        and liveness fds): readable when data, EOF, an error or a pending
        connection is there.  -1 once closed, like the stdlib."""
        h = self._h
        if h is None:
            return -1
        if not self._watch:
            self._watch = True
            _ll.set_watch(h, True)
        return _ll.fileno(h)

    def __repr__(self) -> str:
        h = self._h
        closed = h is None
        s = (
            f"<rsock.socket{' [closed]' if closed else ''} fd={_ll.fileno(h) if h else -1}, "
            f"family={self._family!s}, type={_std.SOCK_STREAM!s}, proto={self._proto}"
        )
        if not closed:
            try:
                s += f", laddr={self.getsockname()}"
            except OSError:
                pass
            if self._peer is not None:
                s += f", raddr={self._peer}"
            if self._connected:
                s += f", provider={self._provider_name!r}"
        return s + ">"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2, source=self)
            self.close()

    def __getstate__(self) -> None:
        raise TypeError(f"cannot pickle {self.__class__.__name__!r} object")

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            _ll.close(h)
        tcp, self._tcp = self._tcp, None
        if tcp is not None:
            tcp.close()
        self._connected = False
        self._closed = True

    # ------------------------------------------------------------ timeouts

    def settimeout(self, value: float | None) -> None:
        if value is None:
            self._timeout = None
            return
        try:
            v = float(value)
        except TypeError:
            raise TypeError("Timeout value must be int, float or None") from None
        if v < 0 or math.isnan(v):
            raise ValueError("Timeout value out of range")
        self._timeout = v

    def gettimeout(self) -> float | None:
        return self._timeout

    def setblocking(self, flag: bool) -> None:
        self._timeout = None if flag else 0.0

    def getblocking(self) -> bool:
        return self._timeout != 0.0

    def _deadline(self) -> float | None:
        t = self._timeout
        return None if t is None or t == 0.0 else time.monotonic() + t

    def _call(self, fn: Any, *args: Any) -> int:
        """Runs ``fn(handle, *args, timeout_ms)`` with the stdlib's timeout
        and EINTR policy; returns its non-negative result."""
        h = self._handle()
        deadline = self._deadline()
        while True:
            rc: int = fn(h, *args, _timeout_ms(self._timeout, deadline))
            if rc >= 0:
                return rc
            if rc == -_errno.EINTR:
                continue  # PEP 475 (signal handlers ran on the way back)
            if rc == -_errno.ETIMEDOUT and self._timeout:
                raise TimeoutError("timed out")
            if rc == -_errno.EAGAIN and self._timeout:
                # an expired timeout with nothing to do
                raise TimeoutError("timed out")
            raise self._raise(rc)

    # ------------------------------------------------------------ addresses

    def _reserve(self) -> _std.socket:
        if self._tcp is None:
            if self._h is None:
                raise OSError(_errno.EBADF, "Bad file descriptor")
            self._tcp = _std.socket(self._family, _std.SOCK_STREAM)
        return self._tcp

    def bind(self, address: Any) -> None:
        self._handle()
        if self._connected or self._listening:
            raise OSError(_errno.EINVAL, "Invalid argument")
        if self._tcp is None:
            raise OSError(_errno.EINVAL, "Invalid argument")
        self._tcp.bind(address)
        self._bound = True

    def getsockname(self) -> Any:
        self._handle()
        if self._local is not None:
            return self._local
        return self._reserve().getsockname()

    def getpeername(self) -> Any:
        self._handle()
        if self._peer is None or not self._connected:
            raise OSError(_errno.ENOTCONN, "Transport endpoint is not connected")
        return self._peer

    def setsockopt(self, level: int, optname: int, value: Any, optlen: int | None = None) -> None:
        self._handle()
        tcp = self._reserve()
        if optlen is None:
            tcp.setsockopt(level, optname, value)
        else:
            tcp.setsockopt(level, optname, None, optlen)

    def getsockopt(self, level: int, optname: int, buflen: int | None = None) -> Any:
        h = self._handle()
        if level == _std.SOL_SOCKET and optname == _std.SO_ERROR:
            return _ll.take_error(h)
        tcp = self._reserve()
        if buflen is None:
            return tcp.getsockopt(level, optname)
        return tcp.getsockopt(level, optname, buflen)

    # ------------------------------------------------------------ server side

    def listen(self, backlog: int = -1) -> None:
        h = self._handle()
        if not isinstance(backlog, int):
            raise TypeError(_not_int(backlog))
        if self._connected:
            raise OSError(_errno.EINVAL, "Invalid argument")
        if backlog < 0:
            backlog = min(_std.SOMAXCONN, 128)
        self._check_provider()
        if self._listening:
            return
        tcp = self._reserve()
        if not self._bound:
            tcp.bind(("0.0.0.0", 0) if self._family == _std.AF_INET else ("::", 0))
            self._bound = True
        host, port = tcp.getsockname()[:2]
        names = [f"rsock/{'4' if self._family == _std.AF_INET else '6'}/{host}/{port}".encode()]
        if (
            self._family == _std.AF_INET6
            and host == "::"
            and not tcp.getsockopt(_std.IPPROTO_IPV6, _std.IPV6_V6ONLY)
        ):
            names.append(f"rsock/4/0.0.0.0/{port}".encode())
        for name in names:
            rc = _ll.listen(h, name, backlog)
            if rc < 0:
                raise _ll.oserror(rc)
        self._listening = True

    def accept(self) -> tuple[socket, Any]:
        if not self._listening:
            self._handle()
            raise OSError(_errno.EINVAL, "Invalid argument")
        h = self._handle()
        deadline = self._deadline()
        peer: tuple[Any, ...] | None = None
        local: tuple[Any, ...] | None = None
        while True:
            rc, nh, peer, local = _ll.accept(h, _timeout_ms(self._timeout, deadline))
            if rc >= 0:
                break
            if rc == -_errno.EINTR:
                continue
            if rc in (-_errno.ETIMEDOUT, -_errno.EAGAIN) and self._timeout:
                raise TimeoutError("timed out")
            raise _ll.oserror(rc)
        assert nh is not None
        mine = self._reserve().getsockname()
        if peer is None or local is None or local[1] != mine[1]:
            # the client's announced addresses are not ours: use what we know
            local = mine
            peer = peer or mine
        sock = socket._accepted(self, nh, peer, local)
        if _std.getdefaulttimeout() is None and self.gettimeout():
            sock.setblocking(True)
        return sock, peer

    # ------------------------------------------------------------ client side

    def _check_provider(self) -> None:
        if self._provider_name != "shm":
            raise OSError(
                _errno.EPROTONOSUPPORT,
                f"RSOCK_PROVIDER={self._provider_name!r}: only 'shm' is available in this build",
            )

    def _resolve(self, address: Any) -> tuple[Any, ...]:
        if not isinstance(address, tuple):
            raise TypeError(
                f"{'AF_INET' if self._family == _std.AF_INET else 'AF_INET6'} address must be "
                f"tuple, not {type(address).__name__}"
            )
        if len(address) < 2:
            raise TypeError("AF_INET address must be a pair (host, port)")
        host, port = address[0], address[1]
        if not isinstance(port, int):
            raise TypeError(_not_int(port))
        if not 0 <= port <= 65535:
            raise OverflowError("connect(): port must be 0-65535.")
        infos = _std.getaddrinfo(host, port, self._family, _std.SOCK_STREAM)
        return tuple(infos[0][4])

    def _connect(self, address: Any) -> int:
        h = self._handle()
        if self._connected:
            return -_errno.EISCONN
        if self._listening:
            return -_errno.EINVAL
        self._check_provider()
        dst = self._resolve(address)
        host = str(dst[0])
        local, src_ip = _is_local(self._family, host)
        if not local:
            if os.environ.get("RSOCK_FALLBACK", "") == "never":
                self._detail = f"{host} is not on this host and RSOCK_FALLBACK=never"
            else:
                self._detail = f"{host} is not on this host (the TCP fallback is not built yet)"
            return -_errno.ECONNREFUSED
        tcp = self._reserve()
        if not self._bound:
            tcp.bind((src_ip, 0) if self._family == _std.AF_INET else (src_ip, 0, 0, 0))
            self._bound = True
        src = tuple(tcp.getsockname())
        deadline = self._deadline()
        rc = -_errno.ECONNREFUSED
        for name in _names(self._family, host, dst[1]):
            while True:
                rc = _ll.connect(
                    h, name, self._family, src, dst, _timeout_ms(self._timeout, deadline)
                )
                if rc != -_errno.EINTR:
                    break
            if rc != -_errno.ECONNREFUSED:
                break
        if rc >= 0:
            self._connected = True
            self._peer = dst if self._family == _std.AF_INET6 else dst[:2]
        return rc

    def connect(self, address: Any) -> None:
        rc = self._connect(address)
        if rc >= 0:
            return
        if rc in (-_errno.ETIMEDOUT, -_errno.EAGAIN) and self._timeout:
            raise TimeoutError("timed out")
        h = self._h
        d = self._detail or (_ll.detail(h) if h is not None else "")
        raise _ll.oserror(rc, d)

    def connect_ex(self, address: Any) -> int:
        try:
            rc = self._connect(address)
        except OSError as e:
            if e.errno is None or isinstance(e, _std.gaierror):
                raise
            return e.errno
        return 0 if rc >= 0 else -rc

    # ------------------------------------------------------------ data

    @staticmethod
    def _flags(flags: int) -> int:
        if not flags:
            return 0
        flags = int(flags)
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
    def _cbuf(data: Any, writable: bool = False) -> Any:
        try:
            return _ll.from_buffer(data, writable)
        except TypeError:
            if writable and isinstance(data, bytes | memoryview):
                raise TypeError("buffer is not writable") from None
            raise TypeError(
                f"a bytes-like object is required, not '{type(data).__name__}'"
            ) from None

    def send(self, data: Buffer, flags: int = 0, /) -> int:
        h = self._h
        if h is not None and self._timeout is None and not flags:
            try:
                cbuf = _raw_from_buffer(data)
            except TypeError:
                pass
            else:
                rc: int = _raw_send(h.ptr, cbuf, len(cbuf), 0, -1)
                if rc >= 0:
                    return rc
        buf = self._cbuf(data)
        return self._call(_ll.send, buf, len(buf), self._flags(flags))

    def sendall(self, data: Buffer, flags: int = 0, /) -> None:
        h = self._h
        if h is not None and self._timeout is None and not flags:
            # hot path: blocking, no flags; C sends everything or fails
            try:
                buf = _raw_from_buffer(data)
            except TypeError:
                pass
            else:
                n = len(buf)
                rc = _raw_send(h.ptr, buf, n, 0, -1)
                if rc == n:
                    return
                # interrupted or failed: the slow path resumes after rc bytes
                self._sendall(data, flags, max(rc, 0))
                return
        self._sendall(data, flags, 0)

    def _sendall(self, data: Buffer, flags: int, done: int) -> None:
        buf = self._cbuf(data)
        f = self._flags(flags)
        n = len(buf)
        h = self._handle()
        deadline = self._deadline()
        while done < n or n == 0:
            rc = _ll.send(h, buf + done, n - done, f, _timeout_ms(self._timeout, deadline))
            if rc >= 0:
                done += rc
                if n == 0:
                    return
                continue
            if rc == -_errno.EINTR:
                continue
            if rc in (-_errno.ETIMEDOUT, -_errno.EAGAIN) and self._timeout:
                raise TimeoutError("timed out")
            raise self._raise(rc)

    def recv(self, bufsize: int, flags: int = 0, /) -> bytes:
        h = self._h
        if h is not None and self._timeout is None and not flags and type(bufsize) is int:
            if bufsize > 0:
                r = _ll.recv_bytes(h, bufsize, 0, -1)
                if type(r) is bytes:
                    return r
        return self._recv(bufsize, flags)

    def _recv(self, bufsize: int, flags: int) -> bytes:
        if not isinstance(bufsize, int):
            raise TypeError(_not_int(bufsize))
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        f = self._flags(flags)
        h = self._handle()
        if bufsize == 0 or f & _ll.F_WAITALL:
            buf = bytearray(bufsize)
            n = self._call(_ll.recv_into, _ll.from_buffer(buf, True), bufsize, f)
            return bytes(buf[:n])
        deadline = self._deadline()
        while True:
            r = _ll.recv_bytes(h, bufsize, f, _timeout_ms(self._timeout, deadline))
            if isinstance(r, bytes):
                return r
            if r == -_errno.EINTR:
                continue
            if r in (-_errno.ETIMEDOUT, -_errno.EAGAIN) and self._timeout:
                raise TimeoutError("timed out")
            raise self._raise(r)

    def recv_into(self, buffer: Buffer, nbytes: int = 0, flags: int = 0) -> int:
        h = self._h
        if h is not None and self._timeout is None and not nbytes and not flags:
            # hot path: blocking, whole buffer, no flags
            try:
                buf = _raw_from_buffer(buffer, require_writable=True)
            except TypeError:
                pass
            else:
                rc: int = _raw_recv(h.ptr, buf, len(buf), 0, -1)
                if rc >= 0:
                    return rc
        return self._recv_into(buffer, nbytes, flags)

    def _recv_into(self, buffer: Buffer, nbytes: int, flags: int) -> int:
        if nbytes < 0:
            raise ValueError("negative buffersize in recv_into")
        buf = self._cbuf(buffer, True)
        size = len(buf)
        if nbytes == 0:
            nbytes = size
        elif nbytes > size:
            raise ValueError("buffer too small for requested bytes")
        return self._call(_ll.recv_into, buf, nbytes, self._flags(flags))

    def shutdown(self, how: int, /) -> None:
        h = self._handle()
        if how not in (_std.SHUT_RD, _std.SHUT_WR, _std.SHUT_RDWR):
            raise OSError(_errno.EINVAL, "Invalid argument")
        if not self._connected:
            raise OSError(_errno.ENOTCONN, "Transport endpoint is not connected")
        rc = _ll.shutdown(h, how)
        if rc < 0:
            raise _ll.oserror(rc)

    # ------------------------------------------------------------ rsock extras

    def stats(self) -> dict[str, int]:
        """Per-connection counters (bytes and messages each way, credit and
        ring-space stalls, notifications armed and sent, spins, sleeps)."""
        return _ll.stats(self._handle())

    def rsock_opts(self) -> dict[str, int]:
        """Ring size, queue depth, inline threshold and spin time in force."""
        o = _ll.get_opts(self._handle())
        return {
            "ring_size": o.ring_size,
            "qdepth": o.qdepth,
            "inline_max": o.inline_max,
            "spin_us": o.spin_us,
        }


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
