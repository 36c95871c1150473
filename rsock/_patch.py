"""``rsock.patch()`` / ``rsock.unpatch()``: rsock under unmodified stdlib code.

``patch()`` replaces one attribute, ``socket.socket``, with a subclass of the
stdlib class whose ``__new__`` dispatches on its arguments:

* ``socket.socket(AF_INET | AF_INET6, SOCK_STREAM[, 0 | IPPROTO_TCP])`` (the
  defaults included, ``SOCK_NONBLOCK``/``SOCK_CLOEXEC`` allowed) returns an
  ``rsock.socket``;
* anything else (``AF_UNIX``, ``SOCK_DGRAM``, raw sockets, ``fileno=``
  adoption, hence ``socketpair``, ``fromfd`` and the sockets a stdlib
  listener's ``accept`` wraps) returns a plain stdlib ``socket.socket``, built
  by the original class.

Because the class is a real subclass of the stdlib one, code that subclasses
``socket.socket`` while patched (``ssl.SSLSocket`` when ``ssl`` is first
imported under the patch) gets an ordinary stdlib socket class: ``__new__``
only dispatches for the patched class itself.  Its metaclass makes
``isinstance(x, socket.socket)`` true for stdlib and rsock sockets alike.

``socket.create_connection``, ``socket.create_server`` (and ``fromfd``,
``socketpair``) are left alone on purpose: the stdlib's versions look
``socket`` up in their module at call time, so under the patch they already
return rsock sockets, with the stdlib's own argument handling and errors.

Sockets rsock itself creates (the kernel socket that reserves an address, the
oracle side of ``rsock.bench``) are never dispatched: calls whose caller is
a module of the ``rsock`` package get the stdlib class.
"""

from __future__ import annotations

import socket as _std
import sys
import threading
from collections import Counter
from typing import Any

from rsock import _socket as _rs

__all__ = ["patch", "unpatch", "is_patched", "counters"]

_Std = _std.socket  # the class being replaced, as imported
_SOCK_FLAGS = getattr(_std, "SOCK_NONBLOCK", 0) | getattr(_std, "SOCK_CLOEXEC", 0)
_STREAM_PROTOS = (-1, 0, int(_std.IPPROTO_TCP))
_FAMILIES = (int(_std.AF_INET), int(_std.AF_INET6))

_lock = threading.Lock()
_active = False
_saved: dict[str, Any] = {}

# What went where, for tests and ``python -m rsock run --report``: sockets the
# patched class created per transport, and connections made ("connect:<provider>")
# and accepted ("accept:<provider>") by the rsock sockets it created.
_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()


def _note(key: str) -> None:
    with _counts_lock:
        _counts[key] += 1


def counters() -> dict[str, int]:
    """A snapshot of the dispatch counters: ``rsock`` and ``stdlib`` (sockets
    the patched class created), ``connect:<provider>`` and
    ``accept:<provider>`` (connections of those rsock sockets)."""
    with _counts_lock:
        return dict(_counts)


def _wants_rsock(family: Any, type: Any, proto: Any, fileno: Any) -> bool:
    if fileno is not None:
        return False
    if not (isinstance(family, int) and isinstance(type, int) and isinstance(proto, int)):
        return False  # the stdlib class raises the right TypeError
    if family != -1 and family not in _FAMILIES:
        return False
    if type != -1 and type & ~_SOCK_FLAGS != _std.SOCK_STREAM:
        return False
    return proto in _STREAM_PROTOS


def _from_rsock() -> bool:
    """Is the code constructing the socket part of the rsock package?"""
    try:
        # 0: _from_rsock, 1: socket.__new__, 2: whoever called socket.socket(...)
        caller = sys._getframe(2)
    except ValueError:
        return False
    name = caller.f_globals.get("__name__", "")
    return isinstance(name, str) and (name == "rsock" or name.startswith("rsock."))


class _TrackedSocket(_rs.socket):
    """The ``rsock.socket`` the patched class hands out: counts its
    connections by provider (nothing on the data path)."""

    def connect(self, address: Any) -> None:
        super().connect(address)
        _note(f"connect:{self.provider}")

    def connect_ex(self, address: Any) -> int:
        rc = super().connect_ex(address)
        if rc == 0:
            _note(f"connect:{self.provider}")
        return rc

    def accept(self) -> tuple[_rs.socket, Any]:
        conn, addr = super().accept()
        _note(f"accept:{conn.provider}")
        return conn, addr


class _SocketMeta(type):
    """``isinstance``/``issubclass`` against the patched class accept stdlib
    and rsock sockets; its subclasses keep the ordinary rules."""

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is socket:
            return isinstance(instance, (_Std, _rs.socket))
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        if cls is socket:
            return issubclass(subclass, (_Std, _rs.socket))
        return super().__subclasscheck__(subclass)


class socket(_Std, metaclass=_SocketMeta):
    """``socket.socket`` while rsock is patched in: AF_INET/AF_INET6
    SOCK_STREAM sockets are ``rsock.socket``, every other kind (and every
    ``fileno=`` adoption) a stdlib socket."""

    def __new__(
        cls,
        family: Any = -1,
        type: Any = -1,
        proto: Any = -1,
        fileno: Any = None,
    ) -> Any:
        if cls is not socket:
            # a subclass (ssl.SSLSocket imported under the patch, user classes):
            # an ordinary stdlib socket; its __init__ runs as usual
            return super().__new__(cls)
        if _active and not _from_rsock():
            if _wants_rsock(family, type, proto, fileno):
                rs = _TrackedSocket(family, type, proto)
                _note("rsock")
                return rs
            _note("stdlib")
        # not an instance of this class, so type.__call__ runs no __init__ on it
        return _Std(family, type, proto, fileno)


def patch() -> None:
    """Make ``socket.socket(AF_INET/AF_INET6, SOCK_STREAM)`` return
    ``rsock.socket`` for all code (stdlib modules included) that looks
    ``socket.socket`` up after this call.  Idempotent."""
    global _active
    with _lock:
        if _active:
            return
        _saved["socket"] = _std.__dict__["socket"]
        _std.socket = socket  # type: ignore[misc]
        _active = True


def unpatch() -> None:
    """Undo ``patch()``: ``socket.socket`` is the stdlib class again.  Sockets
    created meanwhile keep working; the patched class, where code kept a
    reference to it, builds stdlib sockets only.  Idempotent."""
    global _active
    with _lock:
        if not _active:
            return
        _active = False
        original = _saved.pop("socket")
        if _std.__dict__.get("socket") is socket:
            _std.socket = original  # type: ignore[misc]


def is_patched() -> bool:
    """True between ``patch()`` and ``unpatch()``."""
    return _active
