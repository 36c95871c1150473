"""TLS over rsock sockets: ``ssl.SSLSocket``'s surface over the ssl module's
memory-BIO machinery.

``ssl.SSLContext.wrap_socket()`` cannot drive an rsock socket: OpenSSL does
its I/O on the socket's kernel fd, and an rsock connection has none (its
bytes live in the engine's rings).  ``SSLSocket`` here keeps the TLS state in
an ``ssl.SSLObject`` (``SSLContext.wrap_bio`` over two ``ssl.MemoryBIO``\\ s)
and moves the ciphertext with the rsock socket's public ``send``/``recv``, so
certificates, hostname checks, ALPN, sessions, errors and ragged-EOF handling
are OpenSSL's own, exactly as for a stdlib ``ssl.SSLSocket``.

``wrap_socket(context, sock, ...)`` is ``context.wrap_socket(sock, ...)`` for
an rsock socket; ``rsock.patch()`` routes ``ssl.SSLContext.wrap_socket`` here
for rsock sockets.  Like the stdlib, the socket passed in is closed (the
stdlib detaches it): the ``SSLSocket`` owns the connection from then on.

How it follows the stdlib:

* blocking, timeout and non-blocking modes as ``ssl.SSLSocket``: a timeout is
  a deadline for the whole call (``TimeoutError("The read operation timed
  out")`` and the handshake/write variants); in non-blocking mode
  ``ssl.SSLWantReadError``/``ssl.SSLWantWriteError`` are raised where OpenSSL
  would raise them, and a write that raised ``SSLWantWriteError`` (or timed
  out) after its data went into the TLS stream must be retried with the same
  data, as OpenSSL requires: the retry returns its length once the ciphertext
  is out;
* ciphertext is read one TLS record at a time (plus the header of the next),
  so data that is not yet needed stays in the rsock connection and
  ``fileno()`` readability means what it means for a stdlib SSL socket
  (``pending()`` counts decrypted bytes not yet read);
* one thread may read while another writes (separate locks for the two
  directions; the ``SSLObject`` itself is only touched under a third lock);
* ``close()`` sends no close_notify (the stdlib's does not either),
  ``unwrap()`` does the TLS shutdown and returns this object as a plain
  socket, ``shutdown(how)`` drops the TLS layer and shuts the socket down.

This module talks to the rsock socket through its public methods only.
"""

from __future__ import annotations

import errno as _errno
import io
import os
import socket as _std
import ssl
import stat
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, Self, TypeVar, cast

if TYPE_CHECKING:
    from typing_extensions import Buffer

from rsock import _socket as _rs

__all__ = ["SSLSocket", "wrap_socket"]

T = TypeVar("T")

# plaintext handed to the SSLObject per write call (16 records of 16 KiB):
# bounds the ciphertext buffered in memory and lets sending overlap encrypting
_WRITE_CHUNK = 256 * 1024
_HEADER = 5  # TLS record header: type, version (2), length (2)
_SENDFILE_BLOCK = 256 * 1024
_UNSET: Any = object()

# What the stdlib's read() and write() raise when the socket under them fails
# (a reset, a broken pipe): up to 3.12 SSL_read_ex/SSL_write_ex report it as
# an EOF in violation of protocol, SSLEOFError, whatever the errno (which
# suppress_ragged_eofs turns into b"" for a read); 3.13 raises the OSError
# itself (gh-115627).  A handshake or unwrap raises the OSError in both.
_SOCKET_ERROR_IS_EOF = sys.version_info < (3, 13)


def _raise_as_stdlib(x: OSError) -> NoReturn:
    """Raises what the stdlib's read()/write() raise for a failed socket
    call ``x`` (see _SOCKET_ERROR_IS_EOF)."""
    if _SOCKET_ERROR_IS_EOF and isinstance(x, ConnectionError):
        raise ssl.SSLEOFError(ssl.SSL_ERROR_EOF, "EOF occurred in violation of protocol") from x
    raise x


def _encode_hostname(hostname: str | bytes | None) -> str | None:
    """What ``SSLContext`` stores as ``server_hostname`` (IDNA, as text)."""
    if hostname is None:
        return None
    if isinstance(hostname, str):
        return hostname.encode("idna").decode("ascii")
    return hostname.decode("ascii")


def wrap_socket(
    context: ssl.SSLContext,
    sock: _rs.socket,
    server_side: bool = False,
    do_handshake_on_connect: bool = True,
    suppress_ragged_eofs: bool = True,
    server_hostname: str | bytes | None = None,
    session: ssl.SSLSession | None = None,
) -> SSLSocket:
    """``context.wrap_socket(sock, ...)`` for an rsock socket (same arguments,
    same checks, same results): an :class:`SSLSocket`."""
    if not isinstance(context, ssl.SSLContext):
        raise TypeError(f"context must be an ssl.SSLContext, not {type(context).__name__}")
    if not isinstance(sock, _rs.socket):
        raise TypeError(
            f"rsock.ssl_wrap_socket() wraps rsock sockets, not {type(sock).__name__} "
            "(use context.wrap_socket() for those)"
        )
    return SSLSocket._create(
        sock,
        server_side=server_side,
        do_handshake_on_connect=do_handshake_on_connect,
        suppress_ragged_eofs=suppress_ragged_eofs,
        server_hostname=server_hostname,
        context=context,
        session=session,
    )


class _SSLObject(ssl.SSLObject):
    """``ssl.SSLObject`` with ``get_verified_chain()`` and
    ``get_unverified_chain()`` (public from Python 3.13; before, the
    stdlib's SSLSocket offers them on its private C object, ``_sslobj``,
    which here is this object)."""

    def get_verified_chain(self) -> list[Any]:
        return list(self._sslobj.get_verified_chain())  # type: ignore[attr-defined]

    def get_unverified_chain(self) -> list[Any]:
        return list(self._sslobj.get_unverified_chain())  # type: ignore[attr-defined]


class SSLSocket:
    """A TLS connection over an rsock socket with the API of ``ssl.SSLSocket``.

    Instances come from :func:`wrap_socket` (``rsock.ssl_wrap_socket``), from
    ``SSLContext.wrap_socket`` under ``rsock.patch()``, and from ``accept()``
    of a wrapped listening socket."""

    _sock: _rs.socket | None
    _wsock: _rs.socket | None  # a dup() for sends with a timeout
    _sslobj: ssl.SSLObject | None
    _closed: bool
    _io_refs: int
    _context: ssl.SSLContext
    _session: ssl.SSLSession | None
    server_side: bool
    server_hostname: str | None
    do_handshake_on_connect: bool
    suppress_ragged_eofs: bool
    _incoming: ssl.MemoryBIO
    _outgoing: ssl.MemoryBIO
    _recv_lock: threading.Lock  # reads from the wire into _incoming
    _send_lock: threading.Lock  # writes _unsent and _outgoing to the wire
    _ssl_lock: threading.Lock  # the SSLObject and the BIOs
    _unsent: memoryview | None  # ciphertext taken from _outgoing, not sent yet
    _wpending: int | None  # plaintext a write accepted whose ciphertext is not out
    _leftover: bytes  # plain bytes read past the TLS stream (unwrap)
    _hdr: bytearray  # the part of a record header fed so far
    _body_left: int  # bytes of the current record's body still to feed
    _exact: bool  # no read-ahead of the next header (during unwrap)
    _handshake_done: bool
    _rarmed: Any  # the timeout last set on _sock / _wsock
    _warmed: Any
    _timeout: float | None
    _connected: bool
    _family: _std.AddressFamily
    _proto: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"{self.__class__.__name__} does not have a public constructor. "
            "Instances are returned by rsock.ssl_wrap_socket() (or "
            "SSLContext.wrap_socket() under rsock.patch())."
        )

    @classmethod
    def _create(
        cls,
        sock: _rs.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        context: ssl.SSLContext | None = None,
        session: ssl.SSLSession | None = None,
    ) -> SSLSocket:
        if context is None:
            raise TypeError("an SSLContext is required")
        if sock.type != _std.SOCK_STREAM:
            raise NotImplementedError("only stream sockets are supported")
        if server_side:
            if server_hostname:
                raise ValueError("server_hostname can only be specified in client mode")
            if session is not None:
                raise ValueError("session can only be specified in client mode")
        if context.check_hostname and not server_hostname:
            raise ValueError("check_hostname requires server_hostname")

        self = cls.__new__(cls)
        self._sock = None
        self._wsock = None
        self._sslobj = None
        self._closed = False
        self._io_refs = 0
        self._context = context
        self._session = session
        self.server_side = bool(server_side)
        self.server_hostname = _encode_hostname(server_hostname)
        self.do_handshake_on_connect = do_handshake_on_connect
        self.suppress_ragged_eofs = suppress_ragged_eofs
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._recv_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ssl_lock = threading.Lock()
        self._unsent = None
        self._wpending = None
        self._leftover = b""
        self._hdr = bytearray()
        self._body_left = 0
        self._exact = False
        self._handshake_done = False
        self._rarmed = _UNSET
        self._warmed = _UNSET

        self._family = sock.family
        self._proto = sock.proto
        timeout = sock.gettimeout()
        # the stdlib detaches the socket it wraps; an rsock connection has no fd
        # to hand over, so take a second reference and close the caller's
        inner = sock.dup()
        inner._tls_owned = True  # an unclosed one is this object's warning
        sock.close()
        self._sock = inner
        self._timeout = timeout

        try:
            inner.getpeername()
        except OSError as e:
            if e.errno != _errno.ENOTCONN:
                self._real_close()
                raise
            connected = False
        else:
            connected = True
        self._connected = connected
        if connected:
            try:
                self._sslobj = self._new_sslobj()
                if do_handshake_on_connect:
                    if timeout == 0.0:
                        raise ValueError(
                            "do_handshake_on_connect should not be specified for "
                            "non-blocking sockets"
                        )
                    self.do_handshake()
            except (OSError, ValueError):
                self.close()
                raise
        return self

    def _new_sslobj(self) -> ssl.SSLObject:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._unsent = None
        self._wpending = None
        self._hdr.clear()
        self._body_left = 0
        self._handshake_done = False
        obj = self._context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=self.server_side,
            server_hostname=self.server_hostname,
            session=self._session,
        )
        if type(obj) is ssl.SSLObject and not hasattr(obj, "get_verified_chain"):
            obj.__class__ = _SSLObject  # the chain methods of Python 3.13
        # callbacks (sni_callback, msg_callback) get this object, as the
        # stdlib's get its SSLSocket (CPython keeps the owner in the C object)
        inner = getattr(obj, "_sslobj", None)
        if inner is not None:
            try:
                inner.owner = self
            except (AttributeError, TypeError):
                pass
        return obj

    # ------------------------------------------------------------ attributes

    @property
    def context(self) -> ssl.SSLContext:
        """The SSLContext this socket is tied to."""
        return self._context

    @context.setter
    def context(self, ctx: ssl.SSLContext) -> None:
        self._context = ctx
        if self._sslobj is not None:
            self._sslobj.context = ctx

    @property
    def session(self) -> ssl.SSLSession | None:
        """The SSLSession for this connection (client side)."""
        if self._sslobj is not None:
            return self._sslobj.session
        return None

    @session.setter
    def session(self, session: ssl.SSLSession | None) -> None:
        self._session = session
        if self._sslobj is not None:
            self._sslobj.session = session

    @property
    def session_reused(self) -> bool | None:
        """Was the client session reused in this connection's handshake?"""
        if self._sslobj is not None:
            return self._sslobj.session_reused
        return None

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
        return self._timeout

    @property
    def provider(self) -> str | None:
        """rsock extra: the path the underlying connection took."""
        sock = self._sock
        return None if sock is None else sock.provider

    def _inner(self) -> _rs.socket:
        sock = self._sock
        if sock is None:
            raise OSError(_errno.EBADF, "Bad file descriptor")
        return sock

    def __repr__(self) -> str:
        sock = self._sock
        if sock is None:
            return "<rsock.SSLSocket [closed] fd=-1>"
        r = repr(sock)
        head, sep, tail = r.partition(" ")
        return "<rsock.SSLSocket " + tail if sep else r

    def __getstate__(self) -> None:
        raise TypeError(f"cannot pickle {self.__class__.__name__!r} object")

    def __del__(self) -> None:
        # the stdlib's unclosed SSLSocket warns under its own name; the
        # rsock sockets inside stay quiet (_tls_owned) and close with it
        if getattr(self, "_sock", None) is not None:
            if not self._closed:
                warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2, source=self)
            self._real_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *args: object) -> None:
        if not self._closed:
            self.close()

    def fileno(self) -> int:
        """The rsock socket's pollable fd (readable when ciphertext, EOF or an
        error is there; writable while the connection takes bytes), -1 once
        closed."""
        sock = self._sock
        return -1 if sock is None else sock.fileno()

    def _exact_fd(self) -> None:
        """(rsock.patch(): something is about to poll fileno())"""
        sock = self._sock
        if sock is not None:
            sock._exact_fd()

    def getpeername(self) -> Any:
        return self._inner().getpeername()

    def getsockname(self) -> Any:
        return self._inner().getsockname()

    def setsockopt(self, *args: Any) -> None:
        self._inner().setsockopt(*args)

    def getsockopt(self, *args: Any) -> Any:
        return self._inner().getsockopt(*args)

    def get_inheritable(self) -> bool:
        return self._inner().get_inheritable()

    def set_inheritable(self, inheritable: bool) -> None:
        self._inner().set_inheritable(inheritable)

    def bind(self, address: Any, /) -> None:
        self._inner().bind(address)

    def listen(self, backlog: int = -1, /) -> None:
        self._inner().listen(backlog)

    def stats(self) -> dict[str, int]:
        """rsock extra: the connection's counters."""
        return self._inner().stats()

    def rsock_opts(self) -> dict[str, int]:
        """rsock extra: the connection's tunables."""
        return self._inner().rsock_opts()

    # ------------------------------------------------------------ timeouts

    def settimeout(self, value: float | None, /) -> None:
        sock = self._inner()
        sock.settimeout(value)  # validates as the stdlib does
        self._timeout = sock.gettimeout()
        self._rarmed = self._timeout
        w = self._wsock
        if w is not None:
            w.settimeout(self._timeout)
            self._warmed = self._timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def setblocking(self, flag: bool, /) -> None:
        self.settimeout(None if flag else 0.0)

    def getblocking(self) -> bool:
        return self._timeout != 0.0

    def _deadline(self, timeout: float | None) -> float | None:
        return None if not timeout else time.monotonic() + timeout

    @staticmethod
    def _left(deadline: float, what: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"The {what} operation timed out")
        return left

    def _arm_reader(self, timeout: float | None, deadline: float | None, what: str) -> _rs.socket:
        """``_sock`` with its timeout set for this call (what is left of it)."""
        sock = self._inner()
        value = timeout if deadline is None else self._left(deadline, what)
        if value != self._rarmed:
            sock.settimeout(value)
            self._rarmed = value
        return sock

    def _arm_writer(self, timeout: float | None, deadline: float | None, what: str) -> _rs.socket:
        """The socket object sends go through, its timeout set for this call.
        With a timeout, a ``dup()`` of ``_sock``: a reader and a writer in two
        threads each set their own remaining time."""
        if deadline is None:
            sock = self._inner()
            if timeout != self._rarmed:
                sock.settimeout(timeout)
                self._rarmed = timeout
            return sock
        w = self._wsock
        if w is None:
            w = self._wsock = self._inner().dup()
            w._tls_owned = True
            self._warmed = _UNSET
        value = self._left(deadline, what)
        if value != self._warmed:
            w.settimeout(value)
            self._warmed = value
        return w

    def _acquire(self, lock: threading.Lock, deadline: float | None, what: str) -> None:
        if deadline is None:
            lock.acquire()
        elif not lock.acquire(timeout=self._left(deadline, what)):
            raise TimeoutError(f"The {what} operation timed out")

    # ------------------------------------------------------------ the engine

    def _want(self) -> int:
        """How many ciphertext bytes to ask the socket for: the rest of the
        current record and the next header, never more, so that what is not
        needed yet stays in the connection (and keeps ``fileno()`` readable)."""
        if self._body_left:
            return self._body_left if self._exact else self._body_left + _HEADER
        return _HEADER - len(self._hdr)

    def _track(self, data: bytes) -> None:
        """Follows the record boundaries in ciphertext fed to the SSLObject."""
        i, n = 0, len(data)
        hdr = self._hdr
        while i < n:
            if self._body_left:
                take = min(self._body_left, n - i)
                self._body_left -= take
                i += take
            else:
                take = min(_HEADER - len(hdr), n - i)
                hdr += data[i : i + take]
                i += take
                if len(hdr) == _HEADER:
                    self._body_left = (hdr[3] << 8) | hdr[4]
                    hdr.clear()

    def _fill(
        self, timeout: float | None, deadline: float | None, what: str, want: Exception
    ) -> None:
        """Reads ciphertext from the wire into the SSLObject (``_recv_lock``
        held).  Non-blocking: re-raises ``want`` (SSLWantReadError) if there
        is nothing to read."""
        if self._incoming.eof:
            raise ssl.SSLEOFError(ssl.SSL_ERROR_EOF, "EOF occurred in violation of protocol")
        sock = self._arm_reader(timeout, deadline, what)
        try:
            data = sock.recv(self._want())
        except BlockingIOError:
            raise want from None
        except TimeoutError:
            raise TimeoutError(f"The {what} operation timed out") from None
        self._track(data)
        with self._ssl_lock:
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()

    def _drain(self, timeout: float | None, deadline: float | None, what: str) -> None:
        """Sends everything the SSLObject produced (``_send_lock`` held).
        Raises SSLWantWriteError (non-blocking) or TimeoutError with the rest
        kept for the next call."""
        while True:
            buf = self._unsent
            if buf is None:
                with self._ssl_lock:
                    data = self._outgoing.read()
                if not data:
                    return
                buf = memoryview(data)
            if deadline is None and timeout is None:
                self._unsent = None
                self._arm_writer(None, None, what).sendall(buf)
                continue
            while buf:
                try:
                    n = self._arm_writer(timeout, deadline, what).send(buf)
                except BlockingIOError:
                    self._unsent = buf
                    raise ssl.SSLWantWriteError(
                        ssl.SSL_ERROR_WANT_WRITE, "The operation did not complete (write)"
                    ) from None
                except TimeoutError:
                    self._unsent = buf
                    raise TimeoutError(f"The {what} operation timed out") from None
                except BaseException:
                    self._unsent = buf
                    raise
                buf = buf[n:]
            self._unsent = None

    def _flush(
        self, timeout: float | None, deadline: float | None, what: str, wait: bool = False
    ) -> None:
        """Sends what the SSLObject produced for a reader's call (handshake
        flights, alerts, session tickets, close_notify).  If a writer holds
        the send lock, it sends it (``_drain`` runs until the BIO is empty,
        and writers look again after releasing the lock), so a reader does not
        wait for a writer stuck on flow control unless ``wait``."""
        while self._outgoing.pending:
            if not self._send_lock.acquire(blocking=False):
                if not wait:
                    return
                self._acquire(self._send_lock, deadline, what)
            try:
                self._drain(timeout, deadline, what)
            finally:
                self._send_lock.release()

    def _drive(self, op: Callable[[], T], what: str, timeout: float | None) -> T:
        """Runs an SSLObject call that may need input (handshake, read,
        unwrap) to completion under the socket's timeout rules."""
        deadline = self._deadline(timeout)
        self._acquire(self._recv_lock, deadline, what)
        try:
            while True:
                try:
                    with self._ssl_lock:
                        result = op()
                except ssl.SSLWantReadError as want:
                    self._flush(timeout, deadline, what)
                    self._fill(timeout, deadline, what, want)
                    continue
                except ssl.SSLError:
                    # alerts go out first, as OpenSSL sends them on a socket
                    try:
                        self._flush(timeout, deadline, what)
                    except (OSError, ValueError):
                        pass
                    raise
                self._flush(timeout, deadline, what)
                return result
        finally:
            self._recv_lock.release()

    # ------------------------------------------------------------ TLS

    def _check_connected(self) -> None:
        if not self._connected:
            # raises ENOTCONN if it really is not connected
            self.getpeername()

    def _checkClosed(self, msg: str | None = None) -> None:  # noqa: N802 - stdlib name
        pass

    def do_handshake(self, block: bool = False) -> None:
        """Start the SSL/TLS handshake."""
        self._check_connected()
        sslobj = self._sslobj
        if sslobj is None:
            raise ValueError("No SSL wrapper around " + str(self))
        timeout = self._timeout
        if timeout == 0.0 and block:
            timeout = None
        self._drive(sslobj.do_handshake, "handshake", timeout)
        self._handshake_done = True

    def read(self, len: int = 1024, buffer: Buffer | None = None) -> Any:  # noqa: A002
        """Read up to LEN bytes and return them (into BUFFER: their count).
        Return zero-length string on EOF."""
        sslobj = self._sslobj
        if sslobj is None:
            raise ValueError("Read on closed or unwrapped SSL socket.")
        op: Callable[[], Any]
        if buffer is not None:
            buf = buffer
            op = lambda: sslobj.read(len, buf)  # noqa: E731
        else:
            op = lambda: sslobj.read(len)  # noqa: E731
        try:
            try:
                return self._drive(op, "read", self._timeout)
            except OSError as x:
                _raise_as_stdlib(x)
        except ssl.SSLError as x:
            if x.args[0] == ssl.SSL_ERROR_EOF and self.suppress_ragged_eofs:
                return 0 if buffer is not None else b""
            raise

    def write(self, data: Buffer) -> int:
        """Write DATA to the underlying SSL channel.  Returns number of bytes
        of DATA actually transmitted."""
        sslobj = self._sslobj
        if sslobj is None:
            raise ValueError("Write on closed or unwrapped SSL socket.")
        timeout = self._timeout
        if not self._handshake_done:
            # before the handshake (a read may have completed it already)
            if sslobj.version() is None:
                self._drive(sslobj.do_handshake, "handshake", timeout)
            self._handshake_done = True
        try:
            return self._write_all(sslobj, data, timeout)
        except OSError as x:
            _raise_as_stdlib(x)

    def _write_all(self, sslobj: ssl.SSLObject, data: Buffer, timeout: float | None) -> int:
        with memoryview(data) as view:
            chunk = view.cast("B") if view.ndim != 1 or view.format != "B" else view
            if len(chunk) <= _WRITE_CHUNK or timeout == 0.0:
                # non-blocking: one chunk, a short count as send() may return
                return self._write(sslobj, chunk[:_WRITE_CHUNK], timeout)
            # blocking (or with a timeout): all of it, as OpenSSL's SSL_write
            # does for the stdlib; the timeout covers the whole call
            deadline = self._deadline(timeout)
            total = 0
            while total < len(chunk):
                left = None if deadline is None else max(deadline - time.monotonic(), 1e-9)
                try:
                    total += self._write(sslobj, chunk[total : total + _WRITE_CHUNK], left)
                except (TimeoutError, ssl.SSLWantWriteError):
                    if total:
                        return total  # what went out before the time ran out
                    raise
            return total

    def _write(self, sslobj: ssl.SSLObject, chunk: memoryview, timeout: float | None) -> int:
        deadline = self._deadline(timeout)
        self._acquire(self._send_lock, deadline, "write")
        try:
            pending = self._wpending
            if pending is not None:
                # the retry of a write whose data is already in the TLS stream
                self._drain(timeout, deadline, "write")
                self._wpending = None
                return pending
            try:
                with self._ssl_lock:
                    n = sslobj.write(chunk)
            except ssl.SSLWantReadError:
                n = -1  # the TLS layer needs input first (renegotiation): below
            try:
                self._drain(timeout, deadline, "write")
            except (ssl.SSLWantWriteError, TimeoutError):
                if n >= 0:
                    self._wpending = n
                raise
        finally:
            self._send_lock.release()
            if self._outgoing.pending:
                # a reader's output that arrived after our last look
                try:
                    self._flush(timeout, deadline, "write")
                except OSError:
                    pass  # left for the next send
        if n >= 0:
            return n
        return self._write_needing_input(sslobj, chunk, timeout, deadline)

    def _write_needing_input(
        self,
        sslobj: ssl.SSLObject,
        chunk: memoryview,
        timeout: float | None,
        deadline: float | None,
    ) -> int:
        # locks in the readers' order: _recv_lock, then _send_lock
        self._acquire(self._recv_lock, deadline, "write")
        try:
            while True:
                self._acquire(self._send_lock, deadline, "write")
                try:
                    try:
                        with self._ssl_lock:
                            n = sslobj.write(chunk)
                    except ssl.SSLWantReadError as want:
                        self._drain(timeout, deadline, "write")
                        need: Exception = want
                    else:
                        try:
                            self._drain(timeout, deadline, "write")
                        except (ssl.SSLWantWriteError, TimeoutError):
                            self._wpending = n
                            raise
                        return n
                finally:
                    self._send_lock.release()
                self._fill(timeout, deadline, "write", need)
        finally:
            self._recv_lock.release()

    def getpeercert(self, binary_form: bool = False) -> Any:
        """The peer's certificate (a dict, or DER bytes with binary_form);
        None if the peer sent none."""
        self._check_connected()
        sslobj = self._sslobj
        if sslobj is None:
            raise ValueError("No SSL wrapper around " + str(self))
        return sslobj.getpeercert(binary_form)

    def selected_npn_protocol(self) -> None:
        warnings.warn("ssl NPN is deprecated, use ALPN instead", DeprecationWarning, stacklevel=2)
        return None

    def selected_alpn_protocol(self) -> str | None:
        sslobj = self._sslobj
        if sslobj is None or not ssl.HAS_ALPN:
            return None
        return sslobj.selected_alpn_protocol()

    def cipher(self) -> tuple[str, str, int] | None:
        sslobj = self._sslobj
        return None if sslobj is None else sslobj.cipher()

    def shared_ciphers(self) -> list[tuple[str, str, int]] | None:
        sslobj = self._sslobj
        return None if sslobj is None else sslobj.shared_ciphers()

    def compression(self) -> str | None:
        sslobj = self._sslobj
        return None if sslobj is None else sslobj.compression()

    def version(self) -> str | None:
        sslobj = self._sslobj
        return None if sslobj is None else sslobj.version()

    def pending(self) -> int:
        """Decrypted bytes available for read without touching the socket."""
        sslobj = self._sslobj
        if sslobj is None:
            return 0
        with self._ssl_lock:
            return sslobj.pending()

    def get_channel_binding(self, cb_type: str = "tls-unique") -> bytes | None:
        sslobj = self._sslobj
        if sslobj is not None:
            return sslobj.get_channel_binding(cb_type)
        if cb_type not in ssl.CHANNEL_BINDING_TYPES:
            raise ValueError(f"{cb_type} channel binding type not implemented")
        return None

    def verify_client_post_handshake(self) -> None:
        sslobj = self._sslobj
        if sslobj is None:
            raise ValueError("No SSL wrapper around " + str(self))
        with self._ssl_lock:
            sslobj.verify_client_post_handshake()
        self._flush(self._timeout, self._deadline(self._timeout), "write", wait=True)

    def unwrap(self) -> SSLSocket:
        """The TLS shutdown (close_notify both ways); afterwards this object
        is a plain socket over the same connection, and is returned."""
        sslobj = self._sslobj
        if sslobj is None:
            raise ValueError("No SSL wrapper around " + str(self))
        self._exact = True  # read nothing past the peer's close_notify
        try:
            self._drive(sslobj.unwrap, "read", self._timeout)
        finally:
            self._exact = False
        with self._ssl_lock:
            self._sslobj = None
            self._leftover += self._incoming.read()
        return self

    # ------------------------------------------------------------ data

    def send(self, data: Buffer, flags: int = 0) -> int:
        if self._sslobj is not None:
            if flags != 0:
                raise ValueError(
                    f"non-zero flags not allowed in calls to send() on {self.__class__}"
                )
            return self.write(data)
        self._arm_writer(self._timeout, None, "write")
        return self._inner().send(data, flags)

    def sendall(self, data: Buffer, flags: int = 0) -> None:
        if self._sslobj is not None:
            if flags != 0:
                raise ValueError(
                    f"non-zero flags not allowed in calls to sendall() on {self.__class__}"
                )
            with memoryview(data) as view, view.cast("B") as byte_view:
                amount = len(byte_view)
                count = 0
                while count < amount:
                    count += self.send(byte_view[count:])
            return
        self._arm_writer(self._timeout, None, "write")
        self._inner().sendall(data, flags)

    def sendto(self, data: Buffer, flags_or_addr: Any, addr: Any = None) -> int:
        if self._sslobj is not None:
            raise ValueError(f"sendto not allowed on instances of {self.__class__}")
        self._arm_writer(self._timeout, None, "write")
        if addr is None:
            return self._inner().sendto(data, flags_or_addr)
        return self._inner().sendto(data, flags_or_addr, addr)

    def sendmsg(self, *args: Any, **kwargs: Any) -> int:
        raise NotImplementedError(f"sendmsg not allowed on instances of {self.__class__}")

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        if self._sslobj is not None:
            if flags != 0:
                raise ValueError(
                    f"non-zero flags not allowed in calls to recv() on {self.__class__}"
                )
            data: bytes = self.read(buflen)
            return data
        if self._leftover and not flags:
            data, self._leftover = self._leftover[:buflen], self._leftover[buflen:]
            return data
        return self._arm_reader(self._timeout, None, "read").recv(buflen, flags)

    def recv_into(self, buffer: Buffer, nbytes: int | None = None, flags: int = 0) -> int:
        if nbytes is None:
            with memoryview(buffer) as view:
                nbytes = view.nbytes or 1024
        if self._sslobj is not None:
            if flags != 0:
                raise ValueError(
                    f"non-zero flags not allowed in calls to recv_into() on {self.__class__}"
                )
            n: int = self.read(nbytes, buffer)
            return n
        if self._leftover and not flags:
            with memoryview(buffer) as view, view.cast("B") as out:
                k = min(nbytes, len(out), len(self._leftover))
                out[:k] = self._leftover[:k]
            self._leftover = self._leftover[k:]
            return k
        return self._arm_reader(self._timeout, None, "read").recv_into(buffer, nbytes, flags)

    def recvfrom(self, buflen: int = 1024, flags: int = 0) -> tuple[bytes, Any]:
        if self._sslobj is not None:
            raise ValueError(f"recvfrom not allowed on instances of {self.__class__}")
        return self._arm_reader(self._timeout, None, "read").recvfrom(buflen, flags)

    def recvfrom_into(
        self, buffer: Buffer, nbytes: int | None = None, flags: int = 0
    ) -> tuple[int, Any]:
        if self._sslobj is not None:
            raise ValueError(f"recvfrom_into not allowed on instances of {self.__class__}")
        return self._arm_reader(self._timeout, None, "read").recvfrom_into(
            buffer, nbytes or 0, flags
        )

    def recvmsg(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"recvmsg not allowed on instances of {self.__class__}")

    def recvmsg_into(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"recvmsg_into not allowed on instances of {self.__class__}")

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """``socket.sendfile`` over TLS: the stdlib's send() fallback (read
        the file in blocks, send them), with its offset and position rules."""
        if self._sslobj is None:
            self._arm_writer(self._timeout, None, "write")
            return self._inner().sendfile(file, offset, count)
        _rs.check_sendfile_file(file, count)
        if self._timeout == 0.0:
            raise ValueError("non-blocking sockets are not supported")
        try:
            st = os.fstat(file.fileno())
            if stat.S_ISREG(st.st_mode) and not st.st_size:
                return 0
        except (AttributeError, OSError, io.UnsupportedOperation):
            pass
        if offset:
            file.seek(offset)
        block = min(count, _SENDFILE_BLOCK) if count else _SENDFILE_BLOCK
        total = 0
        try:
            while True:
                if count:
                    block = min(count - total, block)
                    if block <= 0:
                        break
                data = memoryview(file.read(block))
                if not data:
                    break
                while data:
                    sent = self.send(data)
                    total += sent
                    data = data[sent:]
            return total
        finally:
            if total > 0 and hasattr(file, "seek"):
                file.seek(offset + total)

    # ------------------------------------------------------------ connections

    def _real_connect(self, addr: Any, connect_ex: bool) -> int | None:
        if self.server_side:
            raise ValueError("can't connect in server-side mode")
        if self._connected or self._sslobj is not None:
            raise ValueError("attempt to connect already-connected SSLSocket!")
        self._sslobj = self._new_sslobj()
        try:
            sock = self._arm_reader(self._timeout, None, "connect")
            rc: int | None
            if connect_ex:
                rc = sock.connect_ex(addr)
            else:
                rc = None
                sock.connect(addr)
            if not rc:
                self._connected = True
                if self.do_handshake_on_connect:
                    self.do_handshake()
            return rc
        except (OSError, ValueError):
            self._sslobj = None
            raise

    def connect(self, addr: Any) -> None:
        """Connects to remote ADDR, and then wraps the connection in an SSL
        channel."""
        self._real_connect(addr, False)

    def connect_ex(self, addr: Any) -> int:
        """Connects to remote ADDR, and then wraps the connection in an SSL
        channel; an error number instead of a connection error."""
        return cast(int, self._real_connect(addr, True))

    def accept(self) -> tuple[SSLSocket, Any]:
        """Accepts a connection, and returns it wrapped with a server-side
        SSL channel (the handshake done if ``do_handshake_on_connect``), and
        the address of the remote client."""
        newsock, addr = self._arm_reader(self._timeout, None, "accept").accept()
        conn = SSLSocket._create(
            newsock,
            server_side=True,
            do_handshake_on_connect=self.do_handshake_on_connect,
            suppress_ragged_eofs=self.suppress_ragged_eofs,
            context=self._context,
        )
        return conn, addr

    def dup(self) -> SSLSocket:
        raise NotImplementedError(f"Can't dup() {self.__class__.__name__} instances")

    def detach(self) -> int:
        """As the rsock socket's ``detach()``: -1 if closed, else an rsock
        connection raises ``OSError(EOPNOTSUPP)`` (a TCP-path one hands over
        its kernel fd, as the stdlib does)."""
        sock = self._sock
        if sock is None:
            self._closed = True
            return -1
        fd = sock.detach()
        self._sock = None
        self._sslobj = None
        self._closed = True
        w, self._wsock = self._wsock, None
        if w is not None:
            w.close()
        return fd

    def makefile(
        self,
        mode: str = "r",
        buffering: int | None = None,
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        """``socket.makefile``: the stdlib's ``SocketIO`` and buffered layers
        over this socket (the plaintext); closing the socket waits for them."""
        return _rs.make_file(self, mode, buffering, encoding, errors, newline)

    def _decref_socketios(self) -> None:
        # called by socket.SocketIO.close()
        if self._io_refs > 0:
            self._io_refs -= 1
        if self._closed:
            self.close()

    def shutdown(self, how: int) -> None:
        """Drops the TLS layer (no close_notify, as the stdlib) and shuts the
        connection down."""
        self._sslobj = None
        self._inner().shutdown(how)

    def close(self) -> None:
        """Closes the connection (no close_notify, as the stdlib's); deferred
        while ``makefile()`` files are open."""
        self._closed = True
        if self._io_refs <= 0:
            self._real_close()

    def _real_close(self) -> None:
        self._sslobj = None
        sock, self._sock = self._sock, None
        w, self._wsock = self._wsock, None
        if w is not None:
            w.close()
        if sock is not None:
            sock.close()
