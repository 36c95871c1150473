"""The TCP path of an ``rsock.socket``: a connection carried by a kernel socket.

A socket takes it when no rsock listener answered (fallback), when it was a
plain TCP client of an rsock listener, or under ``RSOCK_PROVIDER=tcp``.  The
user's object stays what it was (same identity, same class, ``isinstance``
holds): it keeps a :class:`TcpPath` in its ``_tcp`` attribute and every
method hands over to it, so behaviour is the stdlib's exactly.  Methods that
are the kernel socket's own on that path are decorated with :func:`routed`;
the rest (timeouts, close, dup, accept, repr) ask the path object for what
differs.  The engine's hot calls (send, sendall, recv, recv_into) look at
``_tcp`` only once their one-C-call fast path has not applied, so the rsock
path pays nothing for this.

Nothing here imports ``rsock._socket`` (the socket imports this module).
"""

from __future__ import annotations

import errno as _errno
import functools
import socket as _std
from collections.abc import Callable
from typing import Any, TypeVar

from rsock import _lowlevel as _ll

F = TypeVar("F", bound=Callable[..., Any])


class TcpPath:
    """The kernel socket that carries a connection on the TCP path (None
    once closed, detached or handed over)."""

    __slots__ = ("k",)

    def __init__(self, k: _std.socket) -> None:
        self.k: _std.socket | None = k

    def kernel(self) -> _std.socket:
        """The kernel socket; ``OSError(EBADF)`` once it is gone."""
        k = self.k
        if k is None:
            raise _ll.oserror(-_errno.EBADF)
        return k

    @property
    def provider(self) -> str | None:
        return "tcp" if self.k is not None else None

    def fileno(self) -> int:
        k = self.k
        return -1 if k is None else k.fileno()

    def close(self) -> bool:
        """Closes the kernel socket; False if it was gone already."""
        k, self.k = self.k, None
        if k is None:
            return False
        k.close()
        return True

    def detach(self) -> int:
        k, self.k = self.k, None
        return -1 if k is None else k.detach()

    def take(self) -> _std.socket:
        """Hands the kernel socket over: the path is closed from now on."""
        k = self.kernel()
        self.k = None
        return k

    def settimeout(self, value: float | None) -> float | None:
        """``settimeout`` (the stdlib validates); the timeout in force."""
        k = self.kernel()
        k.settimeout(value)
        return k.gettimeout()

    def setblocking(self, flag: bool) -> float | None:
        k = self.kernel()
        k.setblocking(flag)
        return k.gettimeout()

    def listen(self, backlog: int) -> None:
        k = self.kernel()
        if backlog < 0:
            k.listen()
        else:
            k.listen(backlog)

    def repr(self, family: _std.AddressFamily) -> str:
        k = self.k
        if k is None:
            return f"<rsock.socket [closed] fd=-1, family={family}, provider='tcp'>"
        return repr(k).replace("<socket.socket", "<rsock.socket", 1)[:-1] + ", provider='tcp'>"

    def reduce(self) -> tuple[Any, ...]:
        """How multiprocessing hands it to a child: as the kernel socket it is."""
        from multiprocessing import reduction

        reduced: tuple[Any, ...] = reduction._reduce_socket(self.kernel())  # type: ignore[attr-defined]
        return reduced


def routed(fn: F) -> F:
    """A socket method that, on the TCP path, is the kernel socket's own:
    called with the arguments exactly as given, so that its checks, errors
    and defaults are the stdlib's.  (Not for the engine's hot calls: one
    more Python call.)"""
    name = fn.__name__

    @functools.wraps(fn)
    def method(self: Any, /, *args: Any, **kw: Any) -> Any:
        path: TcpPath | None = self._tcp
        if path is not None:
            return getattr(path.kernel(), name)(*args, **kw)
        return fn(self, *args, **kw)

    return method  # type: ignore[return-value]
