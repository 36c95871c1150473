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

asyncio: an rsock socket's ``fileno()`` is not a kernel TCP socket (uvloop
hands it to libuv as one), and it is exact only through the engine's watcher
thread (a wake-up more per event), so the loops' own TCP transports (and
``sock_connect``, ``sock_sendall``) are not used on it.  While patched,
the event loop methods that would build such a transport go through
:mod:`rsock.asyncio` instead (see ``_LOOP_METHODS``): ``create_connection``
and ``create_server`` for TCP (host/port, or ``sock=`` an rsock socket;
``ssl=`` included), hence ``asyncio.open_connection``/``start_server``;
``connect_accepted_socket`` and ``start_tls`` for rsock sockets and
transports; ``sock_connect`` and ``sock_sendall`` on rsock sockets.  Anything
else (AF_UNIX, kernel sockets, arguments rsock.asyncio does not take, a call
made from another loop's thread) reaches the original method untouched.
The methods are class attributes of ``asyncio.base_events.BaseEventLoop``,
``asyncio.selector_events.BaseSelectorEventLoop`` and ``uvloop.Loop`` (a
Python subclass of uvloop's Cython loop): set at ``patch()`` for modules
already imported, else right after the module's first import (a
``sys.meta_path`` finder wraps its loader), and removed by ``unpatch()``.

TLS: ``ssl.SSLContext.wrap_socket`` is replaced the same way (now if ``ssl``
is imported, else at its import): given an rsock socket it returns
:class:`rsock._ssl.SSLSocket` (TLS through ``ssl.MemoryBIO``/``SSLObject``,
since OpenSSL cannot do its I/O on an rsock connection), and calls the
original for anything else.  While patched, ``isinstance(x, socket.socket)``
holds for those TLS sockets too, as it does for ``ssl.SSLSocket``, and so does
``isinstance(x, ssl.SSLSocket)`` when ssl was first imported under the patch.
"""

from __future__ import annotations

import errno
import functools
import itertools
import operator
import os
import select
import selectors
import socket as _std
import sys
import threading
import time
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import importlib.machinery

from rsock import _lowlevel as _ll
from rsock import _socket as _rs
from rsock._readiness import _POLL_SLICE_US, POLLIN, POLLOUT, _loop_poll_us

__all__ = ["patch", "unpatch", "is_patched", "counters"]

_Std = _std.socket  # the class being replaced, as imported
_SOCK_FLAGS = getattr(_std, "SOCK_NONBLOCK", 0) | getattr(_std, "SOCK_CLOEXEC", 0)
_STREAM_PROTOS = (-1, 0, int(_std.IPPROTO_TCP))
_FAMILIES = (int(_std.AF_INET), int(_std.AF_INET6))

_lock = threading.Lock()
_active = False
_saved: dict[str, Any] = {}

# What went where, for tests and ``python -m rsock run --report``: sockets the
# patched class created per transport, connections of rsock sockets made
# ("connect:<provider>") and accepted ("accept:<provider>") while patched,
# whatever the API (rsock._socket counts them), plain TCP clients an rsock
# listener refused ("refused:tcp", RSOCK_FALLBACK=strict), the asyncio calls
# routed to rsock.asyncio ("asyncio:<method>"), and SSLContext.wrap_socket
# calls given an rsock socket ("ssl:wrap_socket").
_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()
_observer: Callable[[str], None] | None = None  # rsock._inherit's report log
# rsock._census (run with --report or RSOCK_FALLBACK=strict; it counts the
# kernel TCP connections made outside the socket module, "unseen:tcp"): told
# of each stdlib socket this class makes or adopts, counted here already
census: Callable[[Any], None] | None = None


def _note(key: str) -> None:
    with _counts_lock:
        _counts[key] += 1
        if _observer is not None:
            _observer(key)


def set_observer(observer: Callable[[str], None] | None) -> None:
    """Call ``observer(key)`` for every event counted from now on."""
    global _observer
    with _counts_lock:
        _observer = observer


def reset_counters() -> None:
    """Start counting from zero, in a fork child (which counts its own
    events; the lock is new, as another thread may have held it at the fork)."""
    global _counts_lock
    _counts_lock = threading.Lock()
    _counts.clear()


def counters() -> dict[str, int]:
    """A snapshot of the dispatch counters: ``rsock`` and ``stdlib`` (sockets
    the patched class created), ``connect:<provider>`` and
    ``accept:<provider>`` (every connection of an rsock socket while patched,
    once, whatever the API), ``refused:tcp``, ``kernel:tcp`` (TCP sockets of a
    module in _KERNEL_ONLY, or of a subclass of the patched class),
    ``asyncio:<method>`` (loop calls routed to rsock.asyncio:
    ``create_connection``, ``create_server``,
    ``connect_accepted_socket``, ``start_tls``, ``sock_connect``)."""
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


# Modules whose sockets must stay kernel sockets: multiprocessing.connection
# hands a connected socket's fd over (detach()) and then reads and writes the
# fd itself (Listener/Client with TCP addresses, managers), which an rsock
# connection cannot do; its connections stay on TCP (README, differences).
_KERNEL_ONLY = frozenset({"multiprocessing.connection"})


def _stays_stdlib() -> str:
    """Is the code constructing the socket part of the rsock package
    ("rsock"), or a module that needs a kernel socket ("kernel",
    _KERNEL_ONLY)?  "" if neither."""
    try:
        # 0: _stays_stdlib, 1: socket.__new__, 2: whoever called socket.socket(...)
        caller = sys._getframe(2)
    except ValueError:
        return ""
    name = caller.f_globals.get("__name__", "")
    if not isinstance(name, str):
        return ""
    if name == "rsock" or name.startswith("rsock."):
        return "rsock"
    return "kernel" if name in _KERNEL_ONLY else ""


class _SocketMeta(type):
    """``isinstance``/``issubclass`` against the patched class accept stdlib
    and rsock sockets (rsock's TLS sockets included); its subclasses keep the
    ordinary rules."""

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is socket:
            return isinstance(instance, _socket_classes())
        if cls is _tls_std and _is_rsock_tls(type(instance)):
            return True  # (ssl imported under the patch: ssl.SSLSocket's metaclass is this)
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        if cls is socket:
            return issubclass(subclass, _socket_classes())
        if cls is _tls_std and _is_rsock_tls(subclass):
            return True
        return super().__subclasscheck__(subclass)


# TLS sockets: rsock's (rsock._ssl.SSLSocket) are instances of ssl.SSLSocket while
# patched, as the stdlib's TLS sockets over TCP are (httpcore reads ALPN from
# an SSLSocket's _sslobj only, websockets' threaded server asserts the type,
# ftplib unwraps only those): the stdlib class this holds for (None: ssl not
# imported yet, imported before the patch, or unpatched)
_tls_std: type | None = None


def _rsock_tls_class() -> type | None:
    """rsock._ssl.SSLSocket once that module has made it (another thread
    may be importing the module right now: partly initialised, it is in
    sys.modules without the class, and no instance of it exists yet)."""
    tls = sys.modules.get("rsock._ssl")
    return getattr(tls, "SSLSocket", None) if tls is not None else None


def _is_rsock_tls(cls: Any) -> bool:
    tls = _rsock_tls_class()
    return tls is not None and _active and isinstance(cls, type) and issubclass(cls, tls)


def _patch_tls_class(module: types.ModuleType) -> None:
    """``isinstance(x, ssl.SSLSocket)`` holds for rsock's TLS sockets from
    now on, if ssl was first imported under the patch (its class's metaclass
    is then ``_SocketMeta``; ``_lock`` held, undone by unpatch).  A class
    made before the patch has ``type``'s checks, which cannot be changed
    (replacing ``ssl.SSLSocket`` would break ssl's own ``_create``, which
    names it in ``super()``)."""
    global _tls_std
    std = module.__dict__.get("SSLSocket")
    if isinstance(std, _SocketMeta):
        _tls_std = std


def _socket_classes() -> tuple[type, ...]:
    """The classes the patched ``socket.socket`` stands for: the stdlib's,
    rsock's, and rsock's TLS socket once that module is loaded (the stdlib's
    ``ssl.SSLSocket`` is a ``socket.socket`` too)."""
    tls = _rsock_tls_class()
    if tls is None:
        return (_Std, _rs.socket)
    return (_Std, _rs.socket, tls)


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
            # an ordinary stdlib socket; its __init__ runs as usual.  A new
            # TCP one (PySocks' socksocket) is a kernel connection: a report
            # shows it (ssl's adopt an fd: not new)
            made = super().__new__(cls)
            if _active and _wants_rsock(family, type, proto, fileno):
                _note("kernel:tcp")
                if census is not None:  # (its fd is made by __init__, later)
                    census(made)
            return made
        why = _stays_stdlib() if _active else "rsock"
        ours = not why
        if _wants_rsock(family, type, proto, fileno):
            if ours:
                rs = _rs.socket(family, type, proto)
                _note("rsock")
                return rs
            if why == "kernel":
                # a TCP socket of a module that needs a kernel one (README,
                # differences): never refused, but a report shows it
                _note("kernel:tcp")
        # not an instance of this class, so type.__call__ runs no __init__ on it
        try:
            std = _Std(family, type, proto, fileno)
            if census is not None:
                census(std)
            if ours:
                _note("stdlib")
            return std
        except OSError as e:
            if not ours or fileno is None or e.errno != errno.ENOTSOCK:
                raise
            # the fileno() of a listener of the process that started this one?
            adopted = _rs.adopt_inherited(family, type, proto, operator.index(fileno))
            if adopted is None:
                raise
            _note("rsock")
            return adopted


# Methods that code calls unbound on the class, ``socket.socket.recv(sock, n)``:
# trio takes them from the class when it is imported (its socket wrapper calls
# them so on every socket).  The patched class answers for the stdlib's
# sockets and rsock's alike.
_UNBOUND = (
    "accept", "recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "recvmsg_into",
    "send", "sendall", "sendto", "sendmsg",
)  # fmt: skip


def _unbound(name: str) -> Callable[..., Any]:
    std = getattr(_Std, name)

    def method(self: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(self, _Std):
            return std(self, *args, **kw)
        return getattr(self, name)(*args, **kw)  # an rsock socket (or its TLS socket)

    method.__name__ = name
    method.__qualname__ = f"socket.{name}"
    method.__doc__ = std.__doc__
    return method


for _name in _UNBOUND:
    if hasattr(_Std, _name):
        setattr(socket, _name, _unbound(_name))


def _os_sendfile(out_fd: Any, in_fd: Any, offset: Any, count: Any) -> int:
    """``os.sendfile`` while patched: to an rsock socket's ``fileno()`` it
    sends into the connection (``rsock.socket._os_sendfile``); the kernel's
    would write into the fd behind ``fileno()`` and fail with EPIPE
    (pyftpdlib takes that for a peer gone and ends a download at 0 bytes;
    asyncio's ``sock_sendfile`` native path).  Anything else, and arguments
    the original would refuse, go to the original."""
    sock = _rs.live(out_fd) if type(out_fd) is int else None
    if (
        sock is not None
        and _rs.owner_of(sock) is sock
        and type(in_fd) is int
        and type(count) is int
        and count >= 0
        and (offset is None or (type(offset) is int and offset >= 0))
    ):
        return sock._os_sendfile(in_fd, offset, count)
    return _saved["sendfile"](out_fd, in_fd, offset, count)  # type: ignore[no-any-return]


_kernel_sendmsg = _Std.sendmsg  # _socket.socket's own


def _sendmsg(self: Any, buffers: Any, ancdata: Any = (), *args: Any) -> int:
    """``sendmsg`` of stdlib sockets while patched (``socket.send_fds``,
    ``multiprocessing.reduction.sendfds``): an rsock socket's ``fileno()``
    in ``SCM_RIGHTS`` is refused with a clear error.  It is the socket's
    readiness fd, not the connection (which lives in this process's engine):
    a process that adopted it read rsock's readiness bytes as data, and its
    client was never answered (a pre-fork server that hands accepted
    connections to workers; README, differences).  A listener's passes."""
    if ancdata:
        ancdata = list(ancdata)
        for item in ancdata:
            try:
                level, kind, data = item
                if level != _std.SOL_SOCKET or kind != _std.SCM_RIGHTS:
                    continue
                raw = memoryview(data).cast("B")
            except (TypeError, ValueError):
                continue  # (the original raises its own error for it)
            for i in range(0, len(raw) - len(raw) % 4, 4):
                fd = int.from_bytes(raw[i : i + 4], sys.byteorder, signed=True)
                sock = _rs.live(fd)
                if sock is not None and sock._tcp is None and not sock._is_listener():
                    raise OSError(
                        errno.EOPNOTSUPP,
                        f"fd {fd} is the fileno() of an rsock connection, which cannot be "
                        "passed to another process (its data is in this process's rsock "
                        "engine, not in the fd); see rsock's README, differences",
                    )
    return _kernel_sendmsg(self, buffers, ancdata, *args)


def patch() -> None:
    """Make ``socket.socket(AF_INET/AF_INET6, SOCK_STREAM)`` return
    ``rsock.socket`` for all code (stdlib modules included) that looks
    ``socket.socket`` up after this call, and route the event loops' TCP
    entry points (asyncio's and uvloop's, imported now or later) to
    rsock.asyncio.  Idempotent."""
    global _active
    with _lock:
        if _active:
            return
        lazy = _lazy_fileno()  # (ValueError: nothing changed yet)
        _saved["socket"] = _std.__dict__["socket"]
        _std.socket = socket  # type: ignore[misc]
        if hasattr(os, "sendfile"):
            _saved["sendfile"] = os.sendfile
            os.sendfile = _os_sendfile
        if "sendmsg" not in _Std.__dict__ and hasattr(_Std, "sendmsg"):
            _installed[(_Std, "sendmsg")] = (_MISSING, _sendmsg)
            _Std.sendmsg = _sendmsg  # type: ignore[method-assign]
        _rs.tally = _note  # every rsock connection counts, whatever made it
        _rs.lazy_fd = lazy
        _patch_pollers(lazy)
        _active = True
        # the loops: now for modules already imported, at import for the others
        # (a module that another thread is importing right now is missed)
        sys.meta_path.insert(0, _finder)
        for name in _HOOKED:
            module = sys.modules.get(name)
            if module is not None and not _initializing(module) and name not in _AT_IMPORT_ONLY:
                _patch_loops(module)


def _lazy_fileno() -> bool:
    """``RSOCK_FILENO``: "lazy" (the default: a connection's fileno() is
    exact once something polls it, see ``_exact``) or "exact" (from its
    first call, as without the patch: for pollers the patch does not hear
    of, C code polling a socket's fd)."""
    mode = os.environ.get("RSOCK_FILENO", "") or "lazy"
    if mode not in ("lazy", "exact"):
        raise ValueError(f"RSOCK_FILENO={mode!r}: 'lazy' or 'exact'")
    return mode == "lazy"


def unpatch() -> None:
    """Undo ``patch()``: ``socket.socket`` is the stdlib class again.  Sockets
    created meanwhile keep working; the patched class, where code kept a
    reference to it, builds stdlib sockets only.  The loop classes get their
    own methods back (servers and transports made meanwhile keep running on
    rsock.asyncio).  Idempotent."""
    global _active, _tls_std
    with _lock:
        if not _active:
            return
        _active = False
        _rs.tally = None
        _rs.lazy_fd = False  # (a lazy fileno() turns exact at its next call)
        _patch_pollers(False)
        original = _saved.pop("socket")
        if _std.__dict__.get("socket") is socket:
            _std.socket = original  # type: ignore[misc]
        sendfile = _saved.pop("sendfile", None)
        if sendfile is not None and os.sendfile is _os_sendfile:
            os.sendfile = sendfile
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        for (cls, name), (before, wrapper) in reversed(list(_installed.items())):
            if cls.__dict__.get(name) is not wrapper:
                continue  # replaced by someone else since: theirs now
            if before is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, before)
        _installed.clear()
        _tls_std = None
        _trio_end_all()


def is_patched() -> bool:
    """True between ``patch()`` and ``unpatch()``."""
    return _active


# --------------------------------------------------------------------------- asyncio
#
# The loop methods replaced while patched, per module and class.  Each wrapper
# decides per call: rsock (rsock.asyncio, or the rsock-aware code below) or the
# original method, called exactly as it was called.

# a reader or writer on an rsock connection's fileno(): the notify fd instead
_FD_METHODS = ("add_reader", "add_writer", "remove_reader", "remove_writer")
# loop methods that wait on a socket's fileno(): a lazy one is made exact first
_POLLS_FILENO = ("sock_recv", "sock_recv_into", "sock_recvfrom", "sock_recvfrom_into")

_LOOP_METHODS: dict[str, dict[str, tuple[str, ...]]] = {
    "asyncio.base_events": {
        "BaseEventLoop": (
            "create_connection",
            "create_server",
            "connect_accepted_socket",
            "start_tls",
            "sendfile",
        ),
    },
    "asyncio.selector_events": {
        "BaseSelectorEventLoop": ("sock_connect", "sock_sendall", *_FD_METHODS, *_POLLS_FILENO),
    },
    "uvloop": {
        "Loop": (
            "create_connection",
            "create_server",
            "connect_accepted_socket",
            "start_tls",
            "sendfile",
            "sock_connect",
            "sock_sendall",
            *_FD_METHODS,
            *_POLLS_FILENO,
        ),
    },
}

# ssl: SSLContext.wrap_socket hands rsock sockets to rsock._ssl
_SSL_METHODS: dict[str, dict[str, tuple[str, ...]]] = {
    "ssl": {"SSLContext": ("wrap_socket",)},
}
# pyOpenSSL: a Connection on a socket does OpenSSL's I/O on its fd, which an rsock
# connection's fileno() is not: refused with a clear error (the client's handshake
# failed with EPIPE, the server's hung: its read took the fd's readiness token)
_OPENSSL_METHODS: dict[str, dict[str, tuple[str, ...]]] = {
    "OpenSSL.SSL": {"Connection": ("__init__",)},
}
# trio: its socket wrapper takes only ``type(sock) is socket.socket``
_TRIO_METHODS: dict[str, dict[str, tuple[str, ...]]] = {
    "trio._socket": {"_SocketType": ("__init__", "close")},
}
# trio's run sets Python's signal wakeup fd and warns if one was set
_TRIO_WAKEUP: dict[str, dict[str, tuple[str, ...]]] = {
    "trio._core._wakeup_socketpair": {"WakeupSocketpair": ("wakeup_on_signals", "close")},
}
# trio's waits on an rsock connection's fileno(): its notify fd instead
_TRIO_IO: dict[str, dict[str, tuple[str, ...]]] = {
    "trio._core._io_epoll": {
        "EpollIOManager": (
            "_update_registrations",
            "process_events",
            "notify_closing",
            "close",
            "wait_writable",
            "get_events",
            "_epoll_wait",
        ),
    },
}
# every module whose classes patch() changes: now, or when it is imported
_HOOKED: dict[str, dict[str, tuple[str, ...]]] = {
    **_LOOP_METHODS,
    **_SSL_METHODS,
    **_OPENSSL_METHODS,
    **_TRIO_METHODS,
    **_TRIO_WAKEUP,
    **_TRIO_IO,
}
# ... only when imported while patched: trio takes the class's methods then
_AT_IMPORT_ONLY = frozenset(_TRIO_METHODS)

_MISSING: Any = object()
# (class, name) -> (what the class's own __dict__ held, _MISSING if nothing; our wrapper)
_installed: dict[tuple[type, str], tuple[Any, Any]] = {}

# keyword arguments rsock.asyncio takes (intersected with the original's own)
_CONNECTION_KW = frozenset(
    {
        "ssl",
        "family",
        "proto",
        "flags",
        "sock",
        "local_addr",
        "server_hostname",
        "ssl_handshake_timeout",
        "ssl_shutdown_timeout",
        "happy_eyeballs_delay",
        "interleave",
        "all_errors",
    }
)
_SERVER_KW = frozenset(
    {
        "family",
        "flags",
        "sock",
        "backlog",
        "ssl",
        "reuse_address",
        "reuse_port",
        "ssl_handshake_timeout",
        "ssl_shutdown_timeout",
        "start_serving",
        "keep_alive",  # 3.13: SO_KEEPALIVE, which has no effect on an rsock connection
    }
)
_ACCEPTED_KW = frozenset({"ssl", "ssl_handshake_timeout", "ssl_shutdown_timeout"})
_START_TLS_KW = frozenset(
    {"server_side", "server_hostname", "ssl_handshake_timeout", "ssl_shutdown_timeout"}
)
_TCP_FAMILIES = (0, int(_std.AF_INET), int(_std.AF_INET6))


def _initializing(module: types.ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _keywords(original: Any, supported: frozenset[str]) -> frozenset[str]:
    """The keyword arguments a call may use and still be routed: those
    rsock.asyncio takes that the original method takes too (a keyword the
    loop does not know must reach it, to raise its own TypeError)."""
    import inspect

    try:
        params = inspect.signature(original).parameters
    except (TypeError, ValueError):
        return supported - {"happy_eyeballs_delay", "interleave", "all_errors", "keep_alive"}
    return supported & frozenset(params)


def _patch_loops(module: types.ModuleType) -> None:
    """Installs the wrappers on ``module``'s loop classes (``_lock`` held)."""
    if module.__name__ == "ssl":
        _patch_tls_class(module)
    for cls_name, names in _HOOKED.get(module.__name__, {}).items():
        cls = getattr(module, cls_name, None)
        if not isinstance(cls, type):
            continue
        for name in names:
            if (cls, name) in _installed:
                continue
            original = getattr(cls, name, None)
            if original is None:
                continue
            wrapper = (_WRAPPERS.get(f"{cls_name}.{name}") or _WRAPPERS[name])(original)
            _installed[(cls, name)] = (cls.__dict__.get(name, _MISSING), wrapper)
            setattr(cls, name, wrapper)


def _imported(module: types.ModuleType) -> None:
    with _lock:
        if _active:
            _patch_loops(module)


class _HookLoader:
    """The real loader of a module in ``_HOOKED``, plus the patching once
    it has run.  The module and its spec get the real loader back first.
    (The import system's protocol, not importlib.abc's classes: importing
    that module costs a process ~1.4 MB, which every fork copies.)"""

    def __init__(self, loader: Any, spec: importlib.machinery.ModuleSpec) -> None:
        self._loader = loader
        self._spec = spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        self._spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        _imported(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder:
    """Finds nothing itself: for a module in ``_HOOKED`` it asks the
    finders after it and wraps the loader of what they found."""

    def find_spec(
        self, fullname: str, path: Any, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _HOOKED or not _active:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookLoader(spec.loader, spec)  # type: ignore[assignment]
        return spec


_finder = _Finder()


def _stands_for(sock: Any) -> Any:
    """``sock``, or the rsock socket it is a proxy of: an object that
    forwards to one (gunicorn's listeners forward every attribute to the
    socket they hold).  A loop given the proxy would take its fileno() for a
    kernel socket's (uvloop's libuv listens on it, fails and closes it)."""
    if sock is None or isinstance(sock, (_rs.socket, _Std)):
        return sock
    owner = _rs.owner_of(sock)
    return sock if owner is None else owner


def _tcp_call(host: Any, port: Any, kw: dict[str, Any], server: bool) -> bool:
    """Is this ``create_connection``/``create_server`` call one for rsock: a
    TCP family, host/port or ``sock=`` an rsock socket (not both, not
    neither), and TLS arguments that make sense?  Calls the loop would
    reject go to the loop, which raises its own error."""
    if kw.get("family", 0) not in _TCP_FAMILIES:
        return False
    sock = kw.get("sock")
    if sock is not None:
        if host is not None or port is not None or not isinstance(sock, _rs.socket):
            return False
    elif host is None and port is None:
        return False
    return _tls_ok(kw, server)


def _tls_ok(kw: dict[str, Any], server: bool) -> bool:
    """TLS arguments rsock.asyncio takes as the loop would: none without
    ``ssl``; a context (or, for a client, True)."""
    ssl = kw.get("ssl")
    if not ssl:
        tls_only = ("ssl_handshake_timeout", "ssl_shutdown_timeout", "server_hostname")
        return all(kw.get(k) is None for k in tls_only)
    if server or ssl is not True:
        import ssl as _ssl

        return isinstance(ssl, _ssl.SSLContext)
    return True


def _wraps(original: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """functools.wraps, but the wrapper keeps its own ``__module__``: the
    name, docstring and signature (``__wrapped__``) are the original's."""
    return functools.wraps(original, assigned=("__name__", "__qualname__", "__doc__"))


# What the loops' own TCP code uses that a test may replace with a double:
# the modules' ``socket`` and the loop's reader/writer, connect/accept and
# transport-making methods (set on the instance).  (A replaced
# ``getaddrinfo`` is no reason: rsock.asyncio resolves through the loop's,
# so the double answers it too.)
_LOOP_MODULES = ("asyncio.base_events", "asyncio.selector_events")
_LOOP_IO = frozenset(
    {
        "_add_reader",
        "_add_writer",
        "add_reader",
        "add_writer",
        "_remove_reader",
        "_remove_writer",
        "remove_reader",
        "remove_writer",
        "sock_connect",
        "sock_accept",
        "_make_socket_transport",
        "_make_ssl_transport",
        "_start_serving",
    }
)


def _doubled(loop: Any) -> bool:
    """For the calls in which the loop makes its own sockets
    (create_connection, create_server; checked there only, not per send):
    has code replaced what the loop's own TCP code uses: its module's
    ``socket`` (``mock.patch('asyncio.base_events.socket')``) or I/O methods
    on the loop object?  Then the call is the loop's: the replacements were
    made for its own code, and rsock.asyncio would go around them (and, with
    the loop's reader callbacks replaced, wait for a wake-up that never
    comes)."""
    for name in _LOOP_MODULES:
        module = sys.modules.get(name)
        if module is not None and module.__dict__.get("socket", _std) is not _std:
            return True
    own: dict[str, Any] = getattr(loop, "__dict__", None) or {}
    return not _LOOP_IO.isdisjoint(own)


def _routable(loop: Any) -> bool:
    """Route this call?  Only while patched, and only on the loop's own
    thread with the loop running (rsock.asyncio works on the running loop)."""
    if not _active:
        return False
    import asyncio

    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _rsock_asyncio() -> Any:
    from rsock import asyncio as rsa

    return rsa


def _wrap_create_connection(original: Any) -> Callable[..., Any]:
    allowed = _keywords(original, _CONNECTION_KW)

    @_wraps(original)
    async def create_connection(
        self: Any, protocol_factory: Any, host: Any = None, port: Any = None, *args: Any, **kw: Any
    ) -> Any:
        if "sock" in kw:
            kw["sock"] = _stands_for(kw["sock"])
        if (
            args
            or not allowed.issuperset(kw)
            or not _tcp_call(host, port, kw, server=False)
            or not _routable(self)
            or _doubled(self)  # the loop makes the sockets: a test's doubles are for it
        ):
            return await original(self, protocol_factory, host, port, *args, **kw)
        _note("asyncio:create_connection")
        transport, protocol = await _rsock_asyncio().create_connection(
            protocol_factory, host, port, **kw
        )
        return transport, protocol

    return create_connection


def _wrap_create_server(original: Any) -> Callable[..., Any]:
    allowed = _keywords(original, _SERVER_KW)

    @_wraps(original)
    async def create_server(
        self: Any, protocol_factory: Any, host: Any = None, port: Any = None, *args: Any, **kw: Any
    ) -> Any:
        if "sock" in kw:
            kw["sock"] = _stands_for(kw["sock"])
        if (
            args
            or not allowed.issuperset(kw)
            or not _tcp_call(host, port, kw, server=True)
            or not _routable(self)
            or _doubled(self)  # the loop makes the sockets: a test's doubles are for it
        ):
            return await original(self, protocol_factory, host, port, *args, **kw)
        _note("asyncio:create_server")
        kw.pop("keep_alive", None)
        start_serving = kw.pop("start_serving", True)
        server = await _rsock_asyncio().create_server(
            protocol_factory, host, port, start_serving=False, **kw
        )
        if start_serving:
            await server.start_serving()
        return server

    return create_server


def _wrap_connect_accepted_socket(original: Any) -> Callable[..., Any]:
    allowed = _keywords(original, _ACCEPTED_KW)

    @_wraps(original)
    async def connect_accepted_socket(
        self: Any, protocol_factory: Any, sock: Any, *args: Any, **kw: Any
    ) -> Any:
        sock = _stands_for(sock)
        if (
            args
            or not isinstance(sock, _rs.socket)
            or not allowed.issuperset(kw)
            or not _tls_ok(kw, server=True)
            or not _routable(self)
        ):
            return await original(self, protocol_factory, sock, *args, **kw)
        _note("asyncio:connect_accepted_socket")
        return await _accepted_transport(self, protocol_factory, sock, **kw)

    return connect_accepted_socket


async def _accepted_transport(
    loop: Any, protocol_factory: Any, sock: _rs.socket, ssl: Any = None, **tls: Any
) -> Any:
    """``connect_accepted_socket`` over an rsock socket: rsock.asyncio's
    transport, with a server-side TLS layer when ``ssl`` is given."""
    rsa = _rsock_asyncio()
    ctx = rsa._ssl_context(ssl, server_side=True)
    tls_args = rsa._ssl_args(tls)
    rsa._check_timeouts(ctx, tls_args)
    if ctx is None:
        return await rsa.create_connection(protocol_factory, sock=sock)
    from asyncio import sslproto

    protocol = protocol_factory()
    waiter = loop.create_future()
    tls_proto = sslproto.SSLProtocol(loop, protocol, ctx, waiter, server_side=True, **tls_args)
    transport = rsa.RsockTransport(loop, sock, tls_proto)
    try:
        await waiter
    except BaseException:
        transport.close()
        raise
    return tls_proto._app_transport, protocol


def _wrap_start_tls(original: Any) -> Callable[..., Any]:
    allowed = _keywords(original, _START_TLS_KW)

    @_wraps(original)
    async def start_tls(
        self: Any, transport: Any, protocol: Any, sslcontext: Any, *args: Any, **kw: Any
    ) -> Any:
        rsa: Any = sys.modules.get("rsock.asyncio")  # no rsock transport without it
        if (
            args
            or not _is_rsock_transport(rsa, transport)
            or not allowed.issuperset(kw)
            or not _routable(self)
        ):
            return await original(self, transport, protocol, sslcontext, *args, **kw)
        _note("asyncio:start_tls")
        return await rsa.start_tls(transport, protocol, sslcontext, **kw)

    return start_tls


def _is_rsock_transport(rsa: Any, transport: Any) -> bool:
    """Is ``transport`` rsock.asyncio's (``rsa``: that module if imported;
    partly, while another thread imports it: then none exists yet)?"""
    cls = getattr(rsa, "RsockTransport", None) if rsa is not None else None
    return cls is not None and isinstance(transport, cls)


def _wrap_sendfile(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    async def sendfile(
        self: Any, transport: Any, file: Any, offset: int = 0, count: int | None = None,
        *, fallback: bool = True,
    ) -> int:  # fmt: skip
        rsa: Any = sys.modules.get("rsock.asyncio")  # no rsock transport without it
        if (
            not _is_rsock_transport(rsa, transport)
            or "_sendfile_native" in getattr(self, "__dict__", ())  # a test's double
            or not _routable(self)
        ):
            return await original(self, transport, file, offset, count, fallback=fallback)  # type: ignore[no-any-return]
        _note("asyncio:sendfile")
        return await rsa.sendfile(transport, file, offset, count, fallback=fallback)  # type: ignore[no-any-return]

    return sendfile


def _wrap_sock_connect(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    async def sock_connect(self: Any, sock: Any, address: Any) -> None:
        if not isinstance(sock, _rs.socket) or not _routable(self):
            _exact(sock)  # (the loop polls its fileno())
            return await original(self, sock, address)  # type: ignore[no-any-return]
        _note("asyncio:sock_connect")
        await _sock_connect(self, sock, address)

    return sock_connect


async def _sock_connect(loop: Any, sock: _rs.socket, address: Any) -> None:
    """``loop.sock_connect`` for an rsock socket (see
    ``rsock.asyncio.connect_socket``)."""
    from rsock.asyncio import connect_socket

    if loop.get_debug() and sock.gettimeout() != 0:
        raise ValueError("the socket must be non-blocking")
    address = await _resolved(loop, sock, address)
    await connect_socket(loop, sock, address)


async def _resolved(loop: Any, sock: _rs.socket, address: Any) -> Any:
    """The address resolved as the loops resolve it (numeric hosts as
    they are, names through ``loop.getaddrinfo``, never blocking the loop)."""
    if not isinstance(address, tuple) or len(address) < 2 or not isinstance(address[0], str):
        return address  # sock.connect raises the stdlib's error
    host, port = address[:2]
    try:
        _std.inet_pton(sock.family, host)
        return address
    except (OSError, ValueError):
        pass
    infos = await loop.getaddrinfo(
        host, port, family=sock.family, type=_std.SOCK_STREAM, proto=sock.proto
    )
    if not infos:
        raise OSError("getaddrinfo() returned empty list")
    resolved = infos[0][4]
    if sock.family == _std.AF_INET6 and len(address) > 2:
        resolved = (*resolved[:2], *address[2:])
    return resolved


def _wrap_sock_sendall(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    async def sock_sendall(self: Any, sock: Any, data: Any) -> None:
        if (
            not isinstance(sock, _rs.socket)
            or sock.provider == "tcp"  # (fell back: a kernel socket, no engine to watch)
            or not _routable(self)
            or _routed(self, sock)
        ):
            _exact(sock)  # (the loop polls its fileno())
            return await original(self, sock, data)  # type: ignore[no-any-return]
        await _sock_sendall(self, sock, data)

    return sock_sendall


def _wrap_polls_fileno(original: Any) -> Callable[..., Any]:
    """A loop's ``sock_recv``-like method: it polls the socket's fileno()
    (uvloop in C, unseen by the patch's other hooks), so a lazy one is made
    exact first."""

    @_wraps(original)
    async def method(self: Any, sock: Any, *args: Any, **kw: Any) -> Any:
        _exact(sock)
        return await original(self, sock, *args, **kw)

    return method


def _send_some(sock: _rs.socket, view: memoryview, pos: int) -> int:
    """Sends from ``pos`` until done or the socket would block: the new pos."""
    while pos < len(view):
        try:
            n = sock.send(view[pos:])
        except (BlockingIOError, InterruptedError):
            break
        if n <= 0:
            break
        pos += n
    return pos


# notify fd -> the future of the sock_sendall that watches it now
_sendall_owner: dict[int, Any] = {}


async def _sock_sendall(loop: Any, sock: _rs.socket, data: Any) -> None:
    """``loop.sock_sendall`` for an rsock socket.  The loops wait for the
    fd to poll writable, which would take a wake-up of the engine's
    watcher thread each time; instead the engine is
    asked to make its notify fd readable while a send would not block
    (interest POLLOUT, as rsock.asyncio's transport does), and that fd is
    watched with a reader, with the liveness fd for a vanished peer.
    ``fileno()`` itself stays free for a concurrent ``sock_recv``."""
    from rsock._readiness import POLLIN, POLLOUT

    if loop.get_debug() and sock.gettimeout() != 0:
        raise ValueError("the socket must be non-blocking")
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    pos = _send_some(sock, view, 0)
    if pos == len(view):
        return
    watch = sock.watch()
    watch.start()  # the notify fd's readiness is exact
    nfd = watch.notify_fd
    fut = loop.create_future()

    def ready() -> None:
        nonlocal pos
        if fut.done():
            return
        try:
            pos = _send_some(sock, view, pos)
        except Exception as exc:
            fut.set_exception(exc)
            return
        if pos == len(view):
            fut.set_result(None)

    _sendall_owner[nfd] = fut  # a later call on the socket takes the fds over
    try:
        # ready() also runs when the liveness fd fires (the peer went)
        watch.arm(loop, ready, POLLIN | POLLOUT)
        ready()  # space may have come back before the interest was set
        await fut
    finally:
        # a call cancelled after a later one took over (asyncio's racing
        # test) must not remove that one's readers: it would never wake
        if _sendall_owner.get(nfd) is fut:
            del _sendall_owner[nfd]
            watch.disarm(loop, POLLIN)


class _FdRoute:
    """``loop.add_reader``/``add_writer`` on an rsock connection's
    ``fileno()`` (tornado's IOStream waits that way).  The loops would poll
    the fileno pair, which the engine's watcher thread keeps exact: one
    thread wake-up more per event.  Instead the loop watches the notify fd
    (the engine keeps it readable while the connection is ready for the
    readers' and writers' events) and the liveness fd, as rsock.asyncio's
    transport does, and runs the reader and the writer the connection is
    ready for, level-triggered as the loops run them.  A route with events
    is polled by the loop's poller while busy, as a transport is
    (``RSOCK_LOOP_POLL_US``)."""

    __slots__ = (
        "loop",
        "fd",
        "sock",
        "_watch",
        "reader",
        "writer",
        "ending",
        "_poller",
        "_polled",
        "_poll_seen",
        "_poll_last",
        "_poll_budget",
        "_poll_long",
    )

    def __init__(self, loop: Any, fd: int, sock: _rs.socket) -> None:
        self.loop = loop
        self.fd = fd
        # weakly: a socket dropped without a close (registered by its fd
        # number) is closed by the GC, as the stdlib's; its last close takes
        # its fds out of the loop's hub first (_closed)
        self.sock = weakref.ref(sock)
        rsa = _rsock_asyncio()
        self._poller = rsa._poller_for(loop, sock)  # (ValueError: a bad budget)
        self._polled = self._poll_seen = False
        self._poll_last = 0
        self._poll_budget = rsa._POLL_UNSET  # (the loop's: never adapted)
        self._poll_long = 0
        self._watch = sock.watch(weak=True)
        # in polling mode from the start when the loop polls (its first
        # arm makes it hot: no readers to register and take out again)
        self._watch.start(polled=self._poller is not None)  # OSError: not a connection
        sock._loop_watches_fd(True, closer=self._closed)  # no watcher-thread wake-ups
        self.reader: Any = None
        self.writer: Any = None
        self.ending = False  # _end is scheduled

    def _closed(self) -> None:
        """The socket's last close (maybe the GC's, in any thread): its fds
        leave the loop's hub before the engine closes them (the peer holds
        the same eventfd: the hub's epoll would keep reporting it).  The
        rest goes as for any stale route (_live_route, on the loop)."""
        self._watch.disarm(self.loop)

    def set(self, writer: bool, handle: Any) -> bool:
        """Replaces the reader (or writer) with ``handle`` (None: removes
        it); whether there was one.  The last one gone ends the route at
        the loop's next round, unless one comes back by then (tornado moves
        its handler between reading and writing that way; and a socket
        closed by then needs no exact fileno() again)."""
        old = self.writer if writer else self.reader
        if old is not None:
            old.cancel()
        if writer:
            self.writer = handle
        else:
            self.reader = handle
        interest = (POLLIN if self.reader else 0) | (POLLOUT if self.writer else 0)
        if interest:
            self._watch.arm(self.loop, self._on_ready, interest)
            self._active()  # someone waits on it: an answer may come soon
        else:
            self._watch.disarm(self.loop)
            if not self.ending:
                self.ending = True
                self.loop.call_soon(self._end)
        return old is not None

    def _active(self) -> None:
        if self._polled:
            self._poll_seen = True
        elif self._poller is not None and self._watch.is_open():
            self._poller.touch(self)

    def _end(self) -> None:
        self.ending = False
        if self.reader is not None or self.writer is not None:
            return  # taken up again
        if _fd_routes.get((id(self.loop), self.fd)) is self:
            del _fd_routes[(id(self.loop), self.fd)]
        if self._poller is not None:
            self._poller.leave(self)
        sock = self.sock()
        if sock is not None and self._watch.is_open():
            self._watch.set_polled(self.loop, self._on_ready, False)
            self._watch.disarm(self.loop, POLLIN)  # (as sock_sendall leaves it)
            # fileno() exact again (lazily: only if a poller asked for it)
            now = not _rs.lazy_fd or sock._core.polled_fd
            sock._loop_watches_fd(False, now=now, closer=self._closed)

    def _on_ready(self) -> None:
        self._active()
        rev = _ll.poll(self._watch.handle) if self._watch.is_open() else POLLIN | POLLOUT
        r, w = self.reader, self.writer
        if r is not None and rev & _READABLE and not r.cancelled():
            r._run()
        if w is not None and w is self.writer and rev & _WRITABLE and not w.cancelled():
            w._run()


_READABLE = _ll.POLLIN | _ll.POLLERR | _ll.POLLHUP
_WRITABLE = _ll.POLLOUT | _ll.POLLERR | _ll.POLLHUP
# Events the loop's own watch of an exact fileno() serves before it is routed:
# a route costs more to set up than the watcher's wake-ups of a short-lived
# connection (a new connection per request: ~3 events a side).  A lazy one
# (nothing made it exact: no socketpair, no watcher) is routed at once.
_ROUTE_AFTER = 8
_NEVER = -(1 << 62)  # the events of a fileno() that cannot be routed
# (id(loop), fd) -> the route of that fileno() on that loop
_fd_routes: dict[tuple[int, int], _FdRoute] = {}


class _Native:
    """An rsock fileno() the loop watches itself: its reader and writer
    (callback, args), and how many events they had."""

    __slots__ = ("sock", "cbs", "events")

    def __init__(self, sock: _rs.socket) -> None:
        self.sock = weakref.ref(sock)  # (the GC closes a dropped socket)
        self.cbs: dict[bool, tuple[Any, tuple[Any, ...]]] = {}  # writer? -> (callback, args)
        self.events = 0


# (id(loop), fd) -> the rsock fileno() the loop watches itself (kept while
# empty: tornado moves its handler between reader and writer)
_fd_native: dict[tuple[int, int], _Native] = {}


def _drop_native(key: tuple[int, int], rec: _Native) -> None:
    """The socket's last close: its record goes (else kept while empty)."""
    if _fd_native.get(key) is rec:
        del _fd_native[key]


def _fd_of(fileobj: Any) -> int:
    if isinstance(fileobj, int):
        return fileobj
    try:
        return int(fileobj.fileno())
    except (AttributeError, TypeError, ValueError):
        return -1


def _exact(fileobj: Any) -> None:
    """Something is about to poll ``fileobj`` (an fd, or an object with
    fileno() as the select module takes them): if it is an rsock
    connection's lazy fileno(), it becomes exact first (also one an event
    loop or an epoll routes meanwhile).  No other object's
    fileno() is called (the poller calls it, once, as it always did), and
    nothing is raised (the poller's own call reports what is wrong)."""
    if type(fileobj) is int:
        fileobj = _rs.live(fileobj)
    exact = getattr(type(fileobj), "_exact_fd", None)  # rsock's sockets, TLS ones too
    if exact is not None:
        try:
            exact(fileobj)
        except OSError:
            pass  # closed meanwhile: the poller finds it so


def _listens(fileobj: Any) -> bool:
    """Is ``fileobj`` (an fd, or an object with fileno()) an rsock listener's?"""
    sock = _rs.live(fileobj) if type(fileobj) is int else fileobj
    is_listener = getattr(type(sock), "_is_listener", None)
    return is_listener is not None and bool(is_listener(sock))


def _select(rlist: Any, wlist: Any, xlist: Any, timeout: Any = None, /) -> Any:
    """``select.select`` while patched: rsock connections whose fileno() is
    lazy are answered by the engine while that needs no wait (something is
    ready, or the timeout is 0: a connection check, as ``_Poll`` does);
    otherwise everything is made exact and the kernel's select waits."""
    rlist, wlist, xlist = _listed(rlist), _listed(wlist), _listed(xlist)
    if (timeout is None or (type(timeout) in (int, float) and timeout >= 0)) and all(
        type(x) in (list, tuple) for x in (rlist, wlist, xlist)
    ):
        lazy: dict[int, int] = {}  # id(object) -> the engine's readiness
        sock: _rs.socket | None = None  # (the last of them)
        for f in (*rlist, *wlist, *xlist):
            conn = _lazy_conn(f)
            if conn is not None:
                sock = conn[1]
                h = sock._h
                lazy[id(f)] = _ll.poll(h) if h is not None else _ll.POLLERR
        if lazy:
            r = [f for f in rlist if lazy.get(id(f), 0) & _READABLE]
            w = [f for f in wlist if lazy.get(id(f), 0) & _WRITABLE]
            if not (r or w or timeout == 0) and len(lazy) == 1 and sock is not None:
                waited = _select_one(sock, rlist, wlist, xlist, timeout)
                if waited is not None:
                    return waited
            if r or w or timeout == 0:
                lists = (rlist, wlist, xlist)
                rest = [_exact_all([f for f in x if id(f) not in lazy]) for x in lists]
                if any(rest):
                    got = _select_std(rest[0], rest[1], rest[2], 0)
                    seen = [{id(f) for f in g} for g in got]
                    r = [f for f in rlist if id(f) in seen[0] or lazy.get(id(f), 0) & _READABLE]
                    w = [f for f in wlist if id(f) in seen[1] or lazy.get(id(f), 0) & _WRITABLE]
                    return r, w, [f for f in xlist if id(f) in seen[2]]
                return r, w, []
    rlist, wlist, xlist = _exact_all(rlist), _exact_all(wlist), _exact_all(xlist)
    return _select_std(rlist, wlist, xlist, timeout)


def _select_one(sock: _rs.socket, rlist: Any, wlist: Any, xlist: Any, timeout: Any) -> Any:
    """select() over one lazy connection (``sock``, listed as one object
    or fd) and nothing else (the usual wait before a ``recv``): the engine
    waits, as a blocking call of the socket would (no exact fd, no watcher
    thread to wake it); None if anything else is listed."""
    f = next(iter((*rlist, *wlist, *xlist)))
    if any(g is not f for g in (*rlist, *wlist, *xlist)):
        return None
    events = (POLLIN if rlist else 0) | (POLLOUT if wlist else 0)
    if not events:
        return None
    rev = sock._wait_events(events, None if timeout is None else float(timeout))
    return (
        [g for g in rlist if rev & _READABLE],
        [g for g in wlist if rev & _WRITABLE],
        [],
    )


def _listed(fileobjs: Any) -> Any:
    """An iterable of select's as a list (read once: it may be a one-shot
    iterator); anything else as it is (select raises its own error)."""
    if type(fileobjs) in (list, tuple):
        return fileobjs
    try:
        return list(fileobjs)
    except TypeError:
        return fileobjs


class _Poll:
    """What ``select.poll()`` makes while patched: the stdlib's poll object,
    told of what it registers first (see ``_exact``).  As the stdlib's, the
    type cannot be called (``_poll`` makes them).

    An rsock connection whose fileno() is lazy (nothing keeps it exact)
    stays so when it is registered: ``poll`` asks the engine for its
    readiness, and only a poll that must wait (nothing ready, a timeout
    other than 0) makes it exact first.  The usual user is a client that
    checks a kept-alive connection before reusing it with a fresh poll
    object and ``poll(0)`` (urllib3's ``wait_for_read``, httpcore's
    ``is_socket_readable``): made exact, its fileno() woke the engine's
    watcher thread at every reply from then on (a thread wake-up on the
    client's CPU per request)."""

    # poll and unregister call the stdlib object's own while no lazy
    # connection is registered (``_routed`` false).  Methods that look at a
    # flag, not bound methods kept on the object: those would make each
    # poll object a reference cycle (garbage for the GC, never freed with
    # the GC off), where the stdlib's is freed when the last name goes
    __slots__ = ("_p", "_routed", "_lazy", "_others")
    _p: Any  # (select.poll's object: typeshed names no class for it)
    _routed: bool  # lazy connections registered: poll and unregister are ours
    # fd -> (its lazy connection, weakly; the events registered for it)
    _lazy: dict[int, tuple[weakref.ref[_rs.socket], int]]
    # the other fds registered (maybe some unregistered since, through the
    # stdlib's own unregister: then a lazy one is not waited for alone)
    _others: set[int]

    def __new__(cls, *args: Any, **kw: Any) -> _Poll:
        raise TypeError(f"cannot create '{cls.__module__}.{cls.__qualname__}' instances")

    def register(self, fd: Any, *eventmask: Any) -> None:
        lazy = _lazy_conn(fd)
        if lazy is None:
            _exact(fd)
            self._p.register(fd, *eventmask)
            n = _known_fd(fd)  # (-1: an object whose fileno() is not ours to call)
            self._others.add(n)
            if self._lazy:
                self._lazy.pop(n, None)
            return
        self._p.register(fd, *eventmask)  # (its checks; its answer for fd is not used)
        n, sock = lazy
        self._others.discard(n)
        mask = operator.index(eventmask[0]) & 0xFFFF if eventmask else _POLL_DEFAULT
        self._lazy[n] = (weakref.ref(sock), mask)
        self._routed = True

    def poll(self, timeout: Any = None, /) -> list[tuple[int, int]]:
        if self._routed:
            return self._poll_lazy(timeout)
        got: list[tuple[int, int]] = self._p.poll(timeout)
        return got

    def unregister(self, fd: Any, /) -> None:
        if self._routed:
            self._unregister_lazy(fd)
        else:
            self._p.unregister(fd)

    def modify(self, fd: Any, *eventmask: Any) -> None:
        n = _known_fd(fd) if self._lazy else -1
        entry = self._lazy.get(n) if n >= 0 else None
        if entry is None:
            _exact(fd)
            self._p.modify(fd, *eventmask)
            return
        self._p.modify(fd, *eventmask)
        self._lazy[n] = (entry[0], operator.index(eventmask[0]) & 0xFFFF)

    def _plain(self) -> None:
        """No lazy connection left: the stdlib object's own methods again."""
        self._routed = False

    def _unregister_lazy(self, fd: Any, /) -> None:
        self._p.unregister(fd)  # (KeyError, as the stdlib's)
        n = _known_fd(fd)
        self._lazy.pop(n, None)
        if n >= 0:
            self._others.discard(n)
        if not self._lazy:
            self._plain()

    def _poll_lazy(self, timeout: Any = None, /) -> list[tuple[int, int]]:
        lazy = self._lazy
        ready: list[tuple[int, int]] = []
        zero = type(timeout) in (int, float) and timeout == 0
        if timeout is None or type(timeout) in (int, float):
            for n, (ref, mask) in list(lazy.items()):
                sock = ref()
                h = sock._h if sock is not None else None
                if sock is None or h is None or _rs.live(n) is not sock or not sock._fd_lazy():
                    # closed (the kernel answers for the number now), or
                    # exact meanwhile
                    del lazy[n]
                    _exact(n)
                    self._others.add(n)
                    continue
                rev = _ll.poll(h) & (mask | _ll.POLLERR | _ll.POLLHUP)
                if rev:
                    ready.append((n, rev))
            if not (ready or zero) and len(lazy) == 1 and not self._others:
                # one lazy connection alone (multiprocessing.connection.wait,
                # urllib3's wait_for_read): the engine waits for it
                ((n, (ref, mask)),) = lazy.items()
                sock = ref()
                events = mask & (POLLIN | POLLOUT)
                if sock is not None and events:
                    wait = None if timeout is None or timeout < 0 else float(timeout) / 1000
                    rev = sock._wait_events(events, wait) & (mask | _ll.POLLERR | _ll.POLLHUP)
                    return [(n, rev)] if rev else []
            if ready or zero:
                if lazy and not self._others:
                    return ready  # (the kernel's poll holds these lazy fds only)
                got: list[tuple[int, int]] = self._p.poll(0)
                if not lazy:
                    self._plain()
                    return got + ready
                return [e for e in got if e[0] not in lazy] + ready
        # it may wait (or the stdlib's rejects the timeout): fileno() exact
        # from now on, and the kernel's poll
        for n in lazy:
            _exact(n)
        lazy.clear()
        self._plain()
        waited: list[tuple[int, int]] = self._p.poll(timeout)
        return waited


_POLL_DEFAULT = select.POLLIN | select.POLLPRI | select.POLLOUT  # poll.register's


def _known_fd(fileobj: Any) -> int:
    """The fd of an int or an rsock socket; -1 for any other object (its
    fileno() is called by the poller only, as the stdlib does)."""
    if type(fileobj) is int:
        return fileobj
    if type(fileobj) is _rs.socket:
        return fileobj.fileno()
    return -1


def _lazy_conn(fileobj: Any) -> tuple[int, _rs.socket] | None:
    """(fd, socket) if ``fileobj`` is an rsock connection (or its fd)
    whose fileno() is lazy, else None."""
    if type(fileobj) is int:
        sock = _rs.live(fileobj)
        if sock is not None and sock._fd_lazy():
            return fileobj, sock
        return None
    if type(fileobj) is _rs.socket and fileobj._fd_lazy():
        return fileobj.fileno(), fileobj
    return None


_EPOLL_DEFAULT = select.EPOLLIN | select.EPOLLPRI | select.EPOLLOUT  # epoll.register's


class _Epoll:
    """``select.epoll`` while patched (the stdlib's cannot be subclassed):
    an epoll object told of what it registers first.

    An rsock connection whose fileno() is lazy (nothing keeps it exact) is
    *routed* when registered (level-triggered, for its read and write
    events): ``poll`` reports fileno() with the events the engine says the
    connection is ready for (as a TCP socket's epoll would), fileno()
    stays lazy.  The engine answers for a new route until a poll must
    wait; then (or at once if a thread waits in the poll, or if someone
    asked for the epoll's fileno() and may poll it) the connection's
    notify and liveness fds go into the epoll in its place: a connection
    whose request is there at the first poll and that closes within the
    busy-poll (a new connection per request) never costs an epoll_ctl.
    Made exact instead, fileno() costs the engine's watcher thread a
    wake-up per event and a dozen system calls per connection to set up
    and tear down (the selectors documentation's echo server accepted new
    connections at 0.69x TCP's rate that way; 0.8x routed).  Any
    other flag (EPOLLET, EPOLLONESHOT, EPOLLEXCLUSIVE, EPOLLWAKEUP...), a
    connection routed by another poller already, a listener or anything
    else: fileno() exact (see ``_exact``) and the kernel's epoll as ever."""

    # poll, unregister and fileno call the stdlib object's own while no
    # connection is routed (fileno() once asked for; poll nearly:
    # _poll_plain), as a flag says: bound methods kept on the object would
    # make each epoll object a reference cycle, its kernel fd open until the
    # GC ran (never with the GC off), where the stdlib's closes when the
    # last name goes
    __slots__ = (
        "_e", "_routed", "_routes", "_unarmed", "_waiting", "_exposed", "_ended", "_serves",
    )  # fmt: skip
    _routed: bool  # poll and unregister are the routes' (_poll_routed, _unregister_routed)
    _routes: dict[int, _EpollRoute]  # fileno() -> its route
    # routes whose fds are not in the epoll yet: a new connection is put in
    # at the first poll that must wait for it (the engine answers before:
    # a new connection's first request is usually there by then, and a
    # short one may never need its fds in the epoll at all)
    _unarmed: list[_EpollRoute]
    # the threads in the kernel's poll (a route registered meanwhile goes in at once)
    _waiting: set[int]
    _exposed: bool  # fileno() was asked for: another poller may wait on it (routes go in at once)
    # [the last activity (monotonic ns) of a route that ended]: the busy
    # poll goes on that long after it (_spins), on the epoll's other fds
    _ended: list[int]
    # an rsock listener was registered: the busy poll also goes on after
    # the process's last rsock accept (the next client's connection)
    _serves: bool

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._take(_epoll_std(*args, **kw))

    def _take(self, e: select.epoll) -> None:
        self._e = e
        self._routes = {}
        self._unarmed = []
        self._waiting = set()
        self._exposed = False
        self._ended = [0]
        self._serves = False
        self._plain()

    def fileno(self) -> int:
        """Whoever asks may poll the epoll's fd itself, so every route's fds
        are in it from then on."""
        if not self._exposed:
            self._exposed = True
            self._arm_all()
        return self._e.fileno()

    def poll(self, timeout: Any = None, maxevents: Any = -1) -> list[tuple[int, int]]:
        if self._routed:
            return self._poll_routed(timeout, maxevents)
        return self._poll_plain(timeout, maxevents)

    def unregister(self, fd: Any) -> None:
        if self._routed:
            self._unregister_routed(fd)
        else:
            self._e.unregister(fd)

    def _plain(self) -> None:
        """No connection routed: the stdlib object's own methods (poll
        nearly: see ``_poll_plain``)."""
        self._routed = False

    def _poll_plain(self, timeout: Any = None, maxevents: Any = -1) -> list[tuple[int, int]]:
        """The kernel's poll, noted as waiting: a connection another thread
        registers meanwhile goes into the epoll at once, and its events
        come out as its fileno()'s.  Busy-polled first while a route ended
        within ``RSOCK_LOOP_POLL_US``, or a listener accepted (see ``_spin``)."""
        if type(timeout) in (int, float) and timeout == 0:  # (a look: nothing waits)
            got0: list[tuple[int, int]] = self._e.poll(timeout, maxevents)
            return self._translate(got0) if _epoll_route_fds else got0
        if (self._ended[0] or self._serves) and _may_wait(timeout):
            start = time.monotonic()
            spun = self._spin(timeout, maxevents)
            if spun is not None:
                return spun
            timeout = _time_left(timeout, start)
        me = threading.get_ident()
        self._waiting.add(me)
        try:
            # a connection another thread registered before this thread
            # counted as waiting (during the busy poll) went in unarmed: in
            # now, after _waiting, so that one registered later arms itself
            if self._unarmed:
                self._arm_all()
            got: list[tuple[int, int]] = self._e.poll(timeout, maxevents)
        finally:
            self._waiting.discard(me)
        return self._translate(got) if _epoll_route_fds else got

    @classmethod
    def fromfd(cls, fd: Any, /) -> _Epoll:
        ep = cls.__new__(cls)
        ep._take(_epoll_std.fromfd(fd))
        ep._exposed = True  # (another epoll object may poll the same kernel epoll)
        return ep

    def register(self, fd: Any, eventmask: Any = _EPOLL_DEFAULT) -> None:
        if self._routes:
            n = _known_fd(fd)
            route = self._routes.get(n) if n >= 0 else None
            if route is not None and route.is_open():
                self._e.fileno()  # (ValueError if closed, as the stdlib's)
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))
        conn = _lazy_conn(fd) if type(eventmask) is int and not eventmask & ~_EPOLL_ROUTED else None
        if conn is not None and not conn[1]._core.loop_fd:
            n, sock = conn
            if not self._e.closed:
                try:
                    route = _EpollRoute(self, n, sock, eventmask)
                except OSError:
                    pass  # closed meanwhile, or not a connection: the kernel's way
                else:
                    self._routes[n] = route
                    self._routed = True
                    _note("epoll:fileno_watch")
                    self._unarmed.append(route)
                    if self._waiting or self._exposed:
                        route.arm()  # (a poll waits in the kernel now)
                    return
        _exact(fd)
        self._e.register(fd, eventmask)
        if not self._serves and _listens(fd):
            self._serves = True

    def modify(self, fd: Any, eventmask: Any) -> None:
        n = _known_fd(fd) if self._routes else -1
        route = self._routes.get(n) if n >= 0 else None
        if route is None or not route.is_open():
            _exact(fd)
            self._e.modify(fd, eventmask)
            if not self._serves and _listens(fd):
                self._serves = True
            return
        if type(eventmask) is not int or eventmask & ~_EPOLL_ROUTED:
            # a flag a route does not keep: fileno() exact, in the kernel's epoll
            route.end(now=True)
            self._e.register(fd, eventmask)
            return
        route.set_mask(eventmask)

    def _unregister_routed(self, fd: Any) -> None:
        n = _known_fd(fd)
        route = self._routes.get(n) if n >= 0 else None
        if route is None:
            self._e.unregister(fd)
            return
        if self._e.closed:
            self._e.unregister(fd)  # (ValueError, as the stdlib's)
        route.end()
        if not self._routes:
            self._plain()

    def _poll_routed(self, timeout: Any = None, maxevents: Any = -1) -> list[tuple[int, int]]:
        """The kernel's poll, the routes' fds reported as their fileno()'s
        events (once per connection; none if the engine finds the
        connection not ready for its mask after all: then the poll goes on
        for what is left of ``timeout``, as the stdlib's would have).  A
        poll that may wait while a connection was active within
        ``RSOCK_LOOP_POLL_US`` busy-polls first (see ``_spin``)."""
        end = -1.0
        if self._unarmed:
            ready = self._unarmed_ready()
            if ready:
                evs = self._translate(self._e.poll(0, maxevents)) + ready
                return evs[:maxevents] if type(maxevents) is int and maxevents > 0 else evs
        if _may_wait(timeout):
            start = time.monotonic()
            spun = self._spin(timeout, maxevents)
            if spun is not None:
                return spun
            if timeout is not None and timeout > 0:
                end = start + timeout
            timeout = _time_left(timeout, start)
        me = threading.get_ident()
        while True:
            self._waiting.add(me)
            try:
                if self._unarmed and timeout != 0:
                    self._arm_all()  # (after _waiting: a route registered now goes in itself)
                got: list[tuple[int, int]] = self._e.poll(timeout, maxevents)
            finally:
                self._waiting.discard(me)
            out = self._translate(got)
            if out or not got:
                return out
            if not self._routes:
                self._plain()
            # only routes' fds, none ready after all (a race with a recv,
            # or the peer's wake-up of a connection waiting for nothing)
            if timeout is None or float(timeout) < 0:
                continue
            now = time.monotonic()
            if end < 0:
                end = now + float(timeout)  # (about: when the poll began)
            if now >= end:
                return out
            timeout = end - now

    def _unarmed_ready(self) -> list[tuple[int, int]]:
        """The events of the routes not in the epoll yet (the engine's answer)."""
        out = []
        for route in list(self._unarmed):
            rev = route.fired(-1)
            if rev:
                out.append((route.fd, rev))
        return out

    def _arm_all(self) -> None:
        """Every route's fds into the epoll (a poll is about to wait)."""
        while self._unarmed:
            self._unarmed.pop().arm()

    def _translate(self, got: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The kernel's events, a route's fds as its fileno()'s events."""
        fds = _epoll_route_fds  # (every epoll's: two may share one kernel epoll, fromfd)
        if not fds:
            return got
        out: list[tuple[int, int]] = []
        done: list[_EpollRoute] = []
        for ev in got:
            route = fds.get(ev[0])
            if route is None:
                out.append(ev)
            elif route not in done:
                done.append(route)
                rev = route.fired(ev[0])
                if rev:
                    out.append((route.fd, rev))
        return out

    def _spin(self, timeout: float | None, maxevents: Any) -> list[tuple[int, int]] | None:
        """Before a poll that may wait (``timeout`` None, negative or > 0
        seconds): while a routed connection was active within
        ``RSOCK_LOOP_POLL_US``, busy-poll those rings (the GIL released,
        ``_EPOLL_SLICE_US`` at a time) and the epoll without waiting in
        between (its other fds), as rsock.asyncio's poller does for a
        loop: a server's next event (the request after a reply, the
        client's close) is then taken without the thread going to sleep
        and being woken.  The events, or None: nothing came (wait on)."""
        poll = self._e.poll
        wait = None if timeout is None else float(timeout)
        routes = [r for r in list(self._routes.values()) if r.interest]
        since = self._ended[0]
        if self._serves and _rs.last_accept_ns > since:
            since = _rs.last_accept_ns
        for ready in _spins(routes, wait, _EPOLL_SLICE_US, since):
            got = poll(0, maxevents)
            # a connection another thread registered during the spin: not in
            # the epoll yet, the engine answers for it
            late = self._unarmed_ready() if self._unarmed else None
            if ready or got or late:
                out = self._translate(got) + late if late else self._translate(got)
                for route in ready:
                    if not any(e[0] == route.fd for e in out):
                        rev = route.fired(-1)
                        if rev:
                            out.append((route.fd, rev))
                if out:
                    # (level-triggered: what is cut off comes with the next)
                    return out[:maxevents] if type(maxevents) is int and maxevents > 0 else out
        if _cooled(self._ended[0]):
            self._ended[0] = 0  # (until the next route ends: no look at the clock)
        return None

    def close(self) -> None:
        for route in list(self._routes.values()):
            route.end()
        self._plain()
        self._e.close()

    def __del__(self) -> None:
        # dropped unclosed: its routes end (the sockets' fileno() is theirs again)
        routes = getattr(self, "_routes", None)
        if routes:
            try:
                for route in list(routes.values()):
                    route.end()
            except Exception:  # (at interpreter exit, module globals may be gone)
                pass

    @property
    def closed(self) -> bool:
        return self._e.closed

    def __enter__(self) -> _Epoll:
        self._e.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _may_wait(timeout: Any) -> bool:
    """May a poll with this ``timeout`` (seconds; None or negative: no
    limit) wait?"""
    return timeout is None or (type(timeout) in (int, float) and timeout != 0)


def _cooled(ended: int) -> bool:
    """Is a route's end (``_spins``' ``ended``) older than the busy poll's
    budget?"""
    return time.monotonic_ns() - ended >= _loop_poll_us() * 1000


def _time_left(timeout: Any, start: float) -> Any:
    """What is left at this moment of a poll's ``timeout`` that began at
    ``start`` (time.monotonic())."""
    if type(timeout) in (int, float) and timeout > 0:
        return max(0.0, start + timeout - time.monotonic())
    return timeout


class _ConnRoute:
    """What the routes of a connection's fileno() (an epoll's, trio's) share:
    the connection, weakly, and its handle when the route began."""

    __slots__ = ()
    sock: weakref.ref[_rs.socket]
    h: _ll.Handle

    def is_open(self) -> bool:
        """Is the route's connection still open (and the same)?"""
        s = self.sock()
        return s is not None and s._h is self.h

    def watch_notify(self) -> tuple[int, int]:
        """The connection's notify and liveness fds, the engine keeping the
        notify fd readable from now on while the connection is ready for
        the route's interest (OSError: closed, or not the route's any more)."""
        sock = self.sock()
        if sock is None or sock._h is not self.h:
            raise _ll.oserror(-errno.EBADF)
        sock._watch(_ll.WATCH_NOTIFY)
        return _ll.notify_fds(self.h)


_R = TypeVar("_R", bound="_HotRoute")


class _HotRoute(Protocol):
    h: _ll.Handle
    last: int  # monotonic_ns of its last event


def _spins(
    routes: list[_R], timeout: float | None, slice_us: int, ended: int = 0
) -> Iterator[list[_R]]:
    """The busy poll of a poller about to sleep up to ``timeout`` s (None:
    no limit): of ``routes``, those active within ``RSOCK_LOOP_POLL_US``
    are polled in their rings (``slice_us`` at a time, the GIL released);
    yields those ready after each slice (maybe none: the caller looks at
    its other fds then), and ends once that budget or the timeout ran out
    (at once if none is hot; or if polling fails).  ``ended``: the last
    activity (monotonic ns) of a route that ended since; within the budget
    after it the poller goes on looking at its other fds without waiting
    (yields [] back to back), hot route or not: a server whose connection
    just closed takes the next client's connection (its listener turning
    readable) without sleeping and being woken, as it took the last
    request."""
    budget = _loop_poll_us() * 1000
    if not budget:
        return
    now = time.monotonic_ns()
    hot = [r for r in routes if now - r.last < budget]
    end = max([r.last for r in hot], default=0)
    if ended > end:
        end = ended
    end += budget
    if end <= now:
        return
    if timeout is not None and timeout >= 0:
        end = min(end, now + int(timeout * 1e9))
    spin = _ll.SpinSet([r.h for r in hot]).spin if hot else None
    while True:
        if spin is None:
            # (as the rings' spin does between rounds: a thread of the
            # process the accept handed a connection to may want this CPU)
            os.sched_yield()
            yield []
        else:
            try:
                ready = spin(slice_us)
            except OSError:
                return
            yield [hot[i] for i in ready]
        if time.monotonic_ns() >= end:
            return


class _EpollRoute(_ConnRoute):
    """One rsock connection's fileno() registered in one ``_Epoll``: the
    connection's notify fd (readable while the connection is ready for the
    registered events: the engine's interest) and liveness fd in the epoll,
    level-triggered.  It holds the socket weakly (a socket dropped without
    a close is closed by the GC, as the stdlib's); the socket's last close
    ends it first (its fds leave the epoll before the engine closes them,
    and fileno() leaves the epoll as a closed fd leaves the kernel's).  It
    holds the stdlib epoll and its owner's tables, not the owner (an
    ``_Epoll`` dropped unclosed ends its routes)."""

    __slots__ = (
        "ep", "routes", "unarmed", "gone", "fd", "sock", "h", "nfd", "lfd", "mask", "interest",
        "armed", "ended", "last",
    )  # fmt: skip

    def __init__(self, owner: _Epoll, fd: int, sock: _rs.socket, mask: int) -> None:
        h = sock._h
        if h is None:
            raise _ll.oserror(-errno.EBADF)
        self.interest = _epoll_interest(mask)
        rc = _ll.set_interest(h, self.interest)
        if rc < 0:
            raise _ll.oserror(rc)  # (not a connection)
        self.ep = owner._e
        self.routes = owner._routes
        self.unarmed = owner._unarmed
        self.gone = owner._ended
        self.fd = fd
        self.h = h
        self.sock = weakref.ref(sock)
        self.mask = mask
        self.nfd = self.lfd = -1  # (arm: in the epoll)
        self.armed = self.ended = False
        self.last = time.monotonic_ns()  # last had events (_Epoll._spin's tempo)
        sock._loop_watches_fd(True, closer=self.end)  # no watcher-thread wake-ups

    def arm(self) -> None:
        """The connection's notify and liveness fds into the epoll (the
        engine keeps the notify fd readable while the connection is ready
        for the route's interest, from now on)."""
        with _epoll_arm_lock:  # (a registering thread and a polling one)
            if self.armed or self.ended:
                return
            self.armed = True
            try:
                self.unarmed.remove(self)
            except ValueError:  # (taken off by _arm_all)
                pass
            try:
                self.nfd, self.lfd = self.watch_notify()
                for f in (self.nfd, self.lfd):
                    if f >= 0:
                        self.ep.register(f, select.EPOLLIN)
                        _epoll_route_fds[f] = self
            except (OSError, ValueError):
                pass  # closed meanwhile: its close ends the route (or the epoll's)

    def set_mask(self, mask: int) -> None:
        if mask != self.mask:
            interest = _epoll_interest(mask)
            if interest != self.interest:
                _ll.set_interest(self.h, interest)
                self.interest = interest
            self.mask = mask

    def fired(self, fd: int) -> int:
        """One of the route's fds was reported (-1: the busy-poll found the
        connection ready): the connection's events for its mask (epoll's
        bits; 0: none)."""
        if not self.is_open():
            self.end()
            return 0
        h = self.h
        if fd >= 0 and fd == self.lfd and _ll.check_peer(h):
            # the peer is gone (level-triggered: its fd is watched no more;
            # the notify fd stays readable from now on)
            self._drop(self.lfd)
            self.lfd = -1
        rev = _ll.poll(h)
        if rev & _ll.POLLIN:
            rev |= select.EPOLLRDNORM
        if rev & _ll.POLLOUT:
            rev |= select.EPOLLWRNORM
        rev &= self.mask | select.EPOLLERR | select.EPOLLHUP
        if rev:
            self.last = time.monotonic_ns()
        return rev

    def _drop(self, fd: int) -> None:
        if _epoll_route_fds.get(fd) is self:
            _epoll_route_fds.pop(fd, None)  # (end() may run in another thread)
            try:
                self.ep.unregister(fd)
            except (OSError, ValueError):  # closed already (the fd, or the epoll)
                pass

    def end(self, now: bool = False) -> None:
        """The route's fds leave the epoll, fileno() with them (``now``:
        fileno() exact at once, else when a poller asks).  Also run by the
        socket's last close (then from any thread) and by the owner's close."""
        with _epoll_arm_lock:  # (not while arm() runs in another thread)
            if self.ended:
                return
            self.ended = True
            self.gone[0] = max(self.gone[0], self.last)
            if self.routes.get(self.fd) is self:
                self.routes.pop(self.fd, None)
            if not self.armed:
                try:
                    self.unarmed.remove(self)
                except ValueError:  # (taken off by _arm_all)
                    pass
            self._drop(self.nfd)
            self._drop(self.lfd)
        sock = self.sock()
        if sock is not None and sock._h is self.h:
            _ll.set_interest(self.h, POLLIN)  # (as sock_sendall leaves it)
            now = now or not _rs.lazy_fd or sock._core.polled_fd
            sock._loop_watches_fd(False, now=now, closer=self.end)


def _epoll_interest(mask: int) -> int:
    """The engine's interest for an epoll event mask."""
    return (POLLIN if mask & (select.EPOLLIN | select.EPOLLRDNORM) else 0) | (
        POLLOUT if mask & (select.EPOLLOUT | select.EPOLLWRNORM) else 0
    )


# every _Epoll's routes by their fds in a kernel epoll (notify and liveness
# fds: open, so unique in the process): two epoll objects may share a kernel
# epoll (fromfd), and each reports the other's routes as their fileno()
_epoll_route_fds: dict[int, _EpollRoute] = {}
_epoll_arm_lock = threading.RLock()  # (a GC finalizer may end a route inside arm())
# longest busy-poll of an _Epoll's rings between two looks at its other fds
# (a listener's new connection waits no longer than that to be seen)
_EPOLL_SLICE_US = 10
# the flags of an epoll registration a route keeps (EPOLLPRI: rsock has no
# urgent data, as a TCP connection nobody sends any on)
_EPOLL_ROUTED = (
    select.EPOLLIN | select.EPOLLOUT | select.EPOLLPRI | select.EPOLLRDNORM | select.EPOLLWRNORM
    | select.EPOLLRDHUP | select.EPOLLERR | select.EPOLLHUP
)  # fmt: skip


def _poll() -> _Poll:
    """``select.poll`` while patched."""
    p = object.__new__(_Poll)
    p._p = _poll_std()
    p._routed = False
    p._lazy = {}
    p._others = set()
    return p


_select_std = select.select
_poll_std = select.poll
_epoll_std = select.epoll
# (module or class, name, stdlib's, ours): the pollers replaced while patched;
# selectors took the select module's at import
_POLLERS: tuple[tuple[Any, str, Any, Any], ...] = (
    (select, "select", select.select, _select),
    (select, "poll", select.poll, _poll),
    (select, "epoll", select.epoll, _Epoll),
    (selectors.SelectSelector, "_select", select.select, staticmethod(_select)),
    (selectors.PollSelector, "_selector_cls", select.poll, staticmethod(_poll)),
    (selectors.EpollSelector, "_selector_cls", select.epoll, _Epoll),
)


def _patch_pollers(on: bool) -> None:
    """The select module's pollers (and selectors' copies of them) tell
    rsock of what they are about to poll, while ``lazy_fd`` (``_lock``
    held).  One someone else replaced meanwhile stays theirs."""
    for owner, name, std, ours in _POLLERS:
        now = owner.__dict__.get(name)
        if on and now is std:
            setattr(owner, name, ours)
        elif not on and now is ours:
            setattr(owner, name, std)


def _exact_all(fileobjs: Any) -> Any:
    """``_exact`` for each of an iterable of them; what to give the poller
    in its place (a one-shot iterator, read once here, as a list)."""
    if type(fileobjs) not in (list, tuple):
        try:
            fileobjs = list(fileobjs)
        except TypeError:
            return fileobjs  # the poller raises its own error
    for f in fileobjs:
        _exact(f)
    return fileobjs


def _live_route(key: tuple[int, int]) -> _FdRoute | None:
    """The route of key if its socket is open and still holds that fd (a
    stale one, whose socket was closed, and maybe the number came back, is
    dropped: the loop's own way then says what a closed fd gets)."""
    route = _fd_routes.get(key)
    if route is None or (route.sock() is _rs.live(key[1]) and route._watch.is_open()):
        return route
    route.set(False, None)
    route.set(True, None)
    _fd_routes.pop(key, None)
    return None


def _new_route(loop: Any, fd: int) -> _FdRoute | None:
    """A route for an rsock connection's fileno() on the running ``loop``,
    or None (not a connection, or not the running loop)."""
    sock = _rs.live(fd)
    if sock is None or not _routable(loop) or loop.is_closed():
        return None
    try:
        route = _FdRoute(loop, fd, sock)
    except OSError:
        return None  # not a connection (a listener, or not connected yet)
    _fd_routes[(id(loop), fd)] = route
    _note("asyncio:fileno_watch")
    return route


def _native_event(loop: Any, key: tuple[int, int], writer: bool) -> None:
    """A reader or writer the loop watches itself had an event: run it;
    the _ROUTE_AFTER-th moves the fd's reader and writer to a route."""
    rec = _fd_native.get(key)
    entry = rec.cbs.get(writer) if rec is not None else None
    if rec is None or entry is None:
        return
    rec.events += 1
    entry[0](*entry[1])
    if rec.events >= _ROUTE_AFTER and _fd_native.get(key) is rec and rec.cbs:
        _to_route(loop, key, rec)


def _route_handler(route: _FdRoute, writer: bool, loop: Any, callback: Any, args: Any) -> None:
    """The route's reader (or writer) becomes ``callback(*args)``, run as
    the loop runs its handles."""
    import asyncio

    route.set(writer, asyncio.Handle(callback, args, loop, None))


def _to_route(loop: Any, key: tuple[int, int], rec: _Native) -> None:
    cbs = dict(rec.cbs)
    for w in cbs:  # (through the wrappers: the record lets go of them)
        (loop.remove_writer if w else loop.remove_reader)(key[1])
    route = _new_route(loop, key[1])
    if route is None:  # the loop's own watch, for good
        for w, (cb, args) in cbs.items():
            (loop.add_writer if w else loop.add_reader)(key[1], cb, *args)
        rec.events = _NEVER
        return
    for w, (cb, args) in cbs.items():
        _route_handler(route, w, loop, cb, args)


def _routed(loop: Any, sock: _rs.socket) -> bool:
    """Is a reader or writer of ``sock`` routed on ``loop`` (then its
    sock_sendall keeps out of the notify fd's interest)?"""
    # (a copy first: other threads' loops add and end routes meanwhile)
    return any(r.sock() is sock for k, r in list(_fd_routes.items()) if k[0] == id(loop))


def _wrap_fd_method(name: str, writer: bool, add: bool) -> Callable[[Any], Callable[..., Any]]:
    def wrap(original: Any) -> Callable[..., Any]:
        if add:

            @_wraps(original)
            def add_fd(self: Any, fd: Any, callback: Any, *args: Any) -> Any:
                key = (id(self), _fd_of(fd))
                route = _live_route(key)
                if route is not None:
                    _route_handler(route, writer, self, callback, args)
                    return None
                sock = _rs.live(key[1])
                if sock is None or (isinstance(fd, _rs.socket) and fd is not sock):
                    return original(self, fd, callback, *args)  # not an rsock fileno()
                if sock._is_listener():
                    # exact without the watcher thread (a dup of the
                    # listener's epoll fd), and never routed: the loop's own
                    return original(self, fd, callback, *args)
                if sock._fd_lazy():
                    # nothing keeps fileno() exact: the loop watches the
                    # notify fd at once (no socketpair, no watcher thread),
                    # unless another route has it (an epoll's: one interest)
                    route = _new_route(self, key[1]) if not sock._core.loop_fd else None
                    if route is not None:
                        _route_handler(route, writer, self, callback, args)
                        return None
                    sock._exact_fd()  # (not the running loop's thread, or routed)
                rec = _fd_native.get(key)
                if rec is None or rec.sock() is not sock:
                    rec = _fd_native[key] = _Native(sock)
                    sock._core.closers.append(functools.partial(_drop_native, key, rec))
                rec.cbs[writer] = (callback, args)
                return original(self, fd, _native_event, self, key, writer)

            return add_fd

        @_wraps(original)
        def remove_fd(self: Any, fd: Any) -> Any:
            key = (id(self), _fd_of(fd))
            if key[1] < 0 and isinstance(fd, _rs.socket):
                # closed since it was added (fileno() -1): its route, as the
                # loops find a closed socket's own registration by the object
                for k, r in list(_fd_routes.items()):
                    if k[0] == key[0] and r.sock() is fd:
                        key = k
            route = _fd_routes.get(key)
            if route is not None:
                return route.set(writer, None)
            rec = _fd_native.get(key)
            if rec is not None:
                rec.cbs.pop(writer, None)
            return original(self, fd)

        return remove_fd

    wrap.__name__ = f"_wrap_{name}"
    return wrap


def _wrap_ssl_wrap_socket(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def wrap_socket(self: Any, sock: Any, *args: Any, **kw: Any) -> Any:
        from rsock import _ssl as _rssl

        if isinstance(sock, _rssl.SSLSocket):
            # the stdlib would build an SSLSocket on its fd (the rsock
            # fileno), which it would then own and close under rsock
            raise ValueError(
                "this socket already uses TLS (an rsock.SSLSocket): it cannot be wrapped "
                "again (unwrap() it first)"
            )
        # (a proxy object of an rsock socket: the stdlib would adopt the
        # rsock fileno; wrap the socket it stands for, which is what
        # detaching the proxy hands over)
        sock = _stands_for(sock)
        if not isinstance(sock, _rs.socket):
            return original(self, sock, *args, **kw)

        _note("ssl:wrap_socket")
        return _rssl.wrap_socket(self, sock, *args, **kw)

    return wrap_socket


def _wrap_openssl_connection_init(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def __init__(self: Any, context: Any, socket: Any = None) -> None:
        sock = _stands_for(socket)
        if isinstance(sock, _rs.socket) and sock._tcp is None:
            raise OSError(
                errno.EOPNOTSUPP,
                "pyOpenSSL's Connection does its I/O on the socket's fd, which is not an rsock "
                "connection: use its memory BIOs (Connection(context, None)) or the ssl module "
                "(see rsock's README, TLS on rsock sockets)",
            )
        original(self, context, socket)

    return __init__


# trio's _SocketType.__init__ (trio 0.35), whose names the wrapper checks
# before it does the same without the type check
_TRIO_INIT_NAMES = frozenset(
    {"TypeError", "__name__", "_did_shutdown_SHUT_WR", "_sock", "_stdlib_socket",
     "setblocking", "socket", "type"}
)  # fmt: skip


def _wrap_trio_socket_init(original: Any) -> Callable[..., Any]:
    """trio wraps a socket only if ``type(sock) is socket.socket``: under the
    patch that class makes rsock sockets and stdlib ones, neither of its own
    type, so trio refused every socket (``trio.socket.socket()``,
    ``serve_tcp``, ``open_tcp_stream``, anyio on trio, hypercorn's trio
    worker).  Those two kinds are taken here as trio takes the class's
    instances; their methods it calls unbound are the patched class's
    (``_UNBOUND``), since trio was imported under the patch.  A trio whose
    ``__init__`` is not the one known here keeps its own check."""
    code = getattr(original, "__code__", None)
    known = code is not None and frozenset(code.co_names) == _TRIO_INIT_NAMES

    @_wraps(original)
    def __init__(self: Any, sock: Any) -> None:
        if known and (type(sock) is _rs.socket or type(sock) is _Std):
            self._sock = sock
            sock.setblocking(False)
            self._did_shutdown_SHUT_WR = False
            if type(sock) is _rs.socket:
                _trio_mark(sock)
            return
        original(self, sock)

    return __init__


def _wrap_trio_socket_close(original: Any) -> Callable[..., Any]:
    """trio's close asks the socket's fileno() (is it open?) and tells its
    IO manager the fd closes (notify_closing: its waiters wake, its epoll
    forgets it).  An open rsock connection whose fileno() nobody asked for
    is in no epoll of trio's by that number: closed at once (its waiters,
    known by its key, woken first), without a stand-in fd made only to be
    closed (three system calls and the IO manager's bookkeeping per
    connection)."""

    @_wraps(original)
    def close(self: Any) -> None:
        sock = getattr(self, "_sock", None)
        if type(sock) is _rs.socket and not sock._fileno_made():
            if sock._trio_key:  # waited on by its key: those waiters wake first
                from trio import lowlevel

                try:
                    lowlevel.notify_closing(sock)
                except RuntimeError:  # (outside trio.run: nobody waits)
                    pass
            sock.close()
            return
        original(self)

    return close


def _wrap_trio_wakeup_on_signals(original: Any) -> Callable[..., Any]:
    """trio.run makes its socketpair Python's signal wakeup fd, and warns
    ("might have collided with another library") if one was set: rsock's
    pipe is, once the main thread has made an rsock socket (hypercorn's trio
    worker gets its listener before trio.run).  rsock's steps aside for the
    run (trio sees none) and comes back when trio restores what it saw."""

    @_wraps(original)
    def wakeup_on_signals(self: Any) -> None:
        hid = _ll.hide_wakeup()
        try:
            original(self)
        finally:
            if hid:
                self._rsock_wakeup_hidden = True

    return wakeup_on_signals


def _wrap_trio_wakeup_close(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def close(self: Any) -> None:
        original(self)
        if self.__dict__.pop("_rsock_wakeup_hidden", False):
            _ll.show_wakeup()

    return close


# ----------------------------------------------------------------- trio's waits
#
# trio waits for a socket with its own epoll (EpollIOManager: EPOLLONESHOT,
# one epoll_ctl per wait) on fileno(), which the engine's watcher thread
# keeps exact: one thread wake-up more per event (trio's round trips ran at
# 0.75-0.8x TCP's).  Instead, a wait on an rsock connection is routed to its
# notify and liveness fds, registered once in trio's epoll
# (level-triggered); the engine keeps the notify fd readable while the
# connection is ready for what trio's tasks wait for, and the events of those
# two fds wake the tasks (their _TrioLoop, consulted first by process_events).
# trio's own bookkeeping (``_registered``: a reader and a writer per fd,
# BusyResourceError, notify_closing, statistics) stays as it is, keyed by an
# int: the fileno() if one was made, else a key of the connection's own
# (negative, so it never names an fd: a wait on the socket object makes no
# stand-in fd, which cost a socket() and a close per connection).  A route
# goes into the epoll only when trio is about to sleep with it still waiting
# (the busy poll first, as _Epoll's routes): a reply that comes within the
# poll costs no epoll_ctl and no wake-up write by the peer.  The route ends
# at notify_closing (trio's close), when the socket is found closed, when the
# run's manager closes, and at unpatch; fileno() is exact again then.


class _TrioLoop:
    """One trio run's routes: its IO manager, the notify and liveness fds
    its routes registered in its epoll (level-triggered, each once per
    connection), which ``process_events`` hands to their route first, and
    the routes a task waits on that are not in the epoll yet."""

    __slots__ = (
        "io", "reschedule", "ep", "fds", "waiting", "unarmed", "thread", "spins", "ended",
    )  # fmt: skip

    def __init__(self, io: Any) -> None:
        from trio import lowlevel

        self.io = io
        self.reschedule = lowlevel.reschedule
        ep = io._epoll  # (the stdlib's own, not _Epoll: these fds are no filenos)
        self.ep: select.epoll = ep._e if type(ep) is _Epoll else ep
        self.fds: dict[int, _TrioRoute] = {}
        # the routes a task waits on (an insertion-ordered set)
        self.waiting: dict[_TrioRoute, None] = {}
        # ... of those, the ones not in the epoll yet (arm_all puts them in)
        self.unarmed: dict[_TrioRoute, None] = {}
        self.thread = threading.get_ident()  # (the run's: get_events may run elsewhere)
        self.spins = 0  # waits the poller ended (tests read it)
        self.ended = 0  # the last activity of a route that ended (see _spins)

    def poll(self, timeout: float) -> list[tuple[Any, int]] | None:
        """trio is about to sleep up to ``timeout`` s: while a connection a
        task waits on was active within ``RSOCK_LOOP_POLL_US``, busy-poll
        those rings first (25 µs at a time, the GIL released, trio's own
        fds looked at in between), as rsock.asyncio's poller does for a
        loop; and its other fds without waiting while a route ended within
        that budget.  Events for trio's process_events, or None: sleep as
        trio does (for what is left of ``timeout``)."""
        routes = [r for r in self.waiting if r.is_open()]
        for ready in _spins(routes, timeout, _POLL_SLICE_US, self.ended):
            if ready:
                self.spins += 1
                return [(r, select.EPOLLIN) for r in ready]
            events = self.ep.poll(0, max(1, len(self.io._registered)))
            if events:
                self.spins += 1
                return events
        if _cooled(self.ended):
            self.ended = 0
        return None

    def unarmed_ready(self) -> list[tuple[Any, int]]:
        """The routes not in the epoll whose connection is ready (the
        engine's answer, no system call), as events for process_events."""
        return [(r, select.EPOLLIN) for r in list(self.unarmed) if r.is_ready()]

    def arm_all(self) -> None:
        """Every waited route's fds into the epoll (trio is about to sleep)."""
        while self.unarmed:
            route = next(iter(self.unarmed))
            del self.unarmed[route]
            route.arm()


class _TrioRoute(_ConnRoute):
    """One rsock connection waited on in one trio run's IO manager (under
    ``key``, the int trio's bookkeeping knows it by): once armed, the
    connection's notify fd (readable while the connection is ready for
    what trio's tasks wait for: the engine's interest) and liveness fd in
    trio's epoll.  It holds the socket weakly (trio's waits hold nothing
    between them, and a socket dropped without a close is closed by the
    GC, as the stdlib's); the socket's last close ends it first (its fds
    leave trio's epoll before the engine closes them: the peer holds the
    same eventfd, so the epoll would keep reporting it).  (What
    ``rsock._readiness.Watch`` does for an asyncio loop, without its
    layers: trio waits and wakes once per call, per connection.)"""

    __slots__ = (
        "loop", "fd", "sock", "h", "nfd", "lfd", "interest", "armed", "reading", "live", "last",
    )  # fmt: skip

    def __init__(self, loop: _TrioLoop, key: int, sock: _rs.socket) -> None:
        h = sock._h
        if h is None or not sock._core.connected:
            raise _ll.oserror(-errno.ENOTCONN)  # (not connected yet: trio's own way)
        self.loop = loop
        self.fd = key
        self.h = h
        self.sock = weakref.ref(sock)
        self.nfd = self.lfd = -1  # (arm: the engine's, in the epoll)
        self.interest = -1  # the engine's, as set here (-1: never)
        self.armed = False  # arm() ran (its fds went in, or the socket had closed)
        self.reading = False  # nfd in the epoll
        self.live = False  # lfd in the epoll
        self.last = time.monotonic_ns()  # last woke a task (the poller's tempo)
        sock._loop_watches_fd(True, closer=self.end)  # no watcher-thread wake-ups

    def _interest(self, interest: int) -> None:
        if interest != self.interest:
            self.interest = interest
            _ll.set_interest(self.h, interest)

    def _add(self, fd: int) -> None:
        loop = self.loop
        try:
            loop.ep.register(fd, select.EPOLLIN)
        except FileExistsError:
            pass
        loop.fds[fd] = self

    def _remove(self, fd: int) -> None:
        loop = self.loop
        if loop.fds.get(fd) is self:
            loop.fds.pop(fd, None)  # (end() may run in another thread)
            try:
                loop.ep.unregister(fd)
            except OSError:  # closed already (then it left the epoll)
                pass

    def is_ready(self) -> bool:
        """Is the connection ready for what its tasks wait for (or closed)?"""
        if not self.is_open():
            return True
        return bool(_ll.poll(self.h) & (self.interest | _ll.POLLERR | _ll.POLLHUP))

    def arm(self) -> None:
        """The connection's notify and liveness fds into trio's epoll (the
        engine keeps the notify fd readable while the connection is ready
        for the route's interest, from now on)."""
        if self.armed:
            return
        self.armed = True
        try:
            self.nfd, self.lfd = self.watch_notify()
        except OSError:
            return  # closed meanwhile: its close ends the route
        self._add(self.nfd)
        self.reading = True
        if self.lfd >= 0:
            self._add(self.lfd)
            self.live = True

    def update(self, waiters: Any) -> bool:
        """The engine's interest as trio's waiters of the fd want; whether
        anyone waits.  With no one left, POLLIN is kept (a reader usually
        comes back before the next data) and the fds stay registered; the
        notify fd reads idle meanwhile unless data came."""
        interest = (POLLIN if waiters.read_task is not None else 0) | (
            POLLOUT if waiters.write_task is not None else 0
        )
        loop = self.loop
        if not interest:
            loop.waiting.pop(self, None)
            loop.unarmed.pop(self, None)
            self._interest(self.interest & POLLIN if self.interest > 0 else 0)
            return False
        loop.waiting[self] = None
        self._interest(interest)
        if not self.armed:
            loop.unarmed[self] = None
        elif not self.reading and self.nfd >= 0:
            self._add(self.nfd)  # (left the epoll when the connection ended)
            self.reading = True
        return True

    def fired(self, fd: int) -> bool:
        """One of the route's fds was reported (-1: the busy poll found the
        connection ready): wake trio's waiters; False if the socket is
        closed (its fds closed with it: their numbers are not the route's
        any more, the event is trio's)."""
        if not self.is_open():
            fds = self.loop.fds
            for f in (self.nfd, self.lfd):
                if f >= 0 and fds.get(f) is self:
                    fds.pop(f, None)
            self.loop.waiting.pop(self, None)
            self.loop.unarmed.pop(self, None)
            self.loop.ended = max(self.loop.ended, self.last)
            self.reading = self.live = False
            if fd >= 0:
                return False
            self.ready()  # (the busy poll's find: its waiters wake, as a closed fd's)
            return True
        self.ready()
        if fd >= 0 and fd == self.lfd and self.live:
            # 0: not gone yet (a FIN may still come: verbs' CM hang-up can
            # overtake the last completions); the engine makes the fd
            # readable again when that grace ends, so it stays registered
            if not self.is_open() or _ll.check_peer(self.h):
                self._remove(self.lfd)
                self.live = False
                self.lfd = -1  # level-triggered hang-up: watched no more
                self.ready()
        return True

    def ready(self) -> None:
        """Wake the waiters whose event the connection has (an error or
        hang-up wakes both, as trio does)."""
        io = self.loop.io
        waiters = io._registered.get(self.fd)
        is_open = self.is_open()
        if waiters is None:
            self._interest(0)
            if not is_open or _ll.poll(self.h) & (_ll.POLLERR | _ll.POLLHUP):
                # ended: the notify fd stays readable whatever the interest,
                # so it leaves the epoll until someone waits again
                if self.reading:
                    self._remove(self.nfd)
                    self.reading = False
            return
        rev = _ll.poll(self.h) if is_open else _READABLE | _WRITABLE
        if rev:
            self.last = time.monotonic_ns()
        reschedule = self.loop.reschedule
        if rev & _WRITABLE and waiters.write_task is not None:
            reschedule(waiters.write_task)
            waiters.write_task = None
        if rev & _READABLE and waiters.read_task is not None:
            reschedule(waiters.read_task)
            waiters.read_task = None
        if not is_open:
            io._update_registrations(self.fd)  # (the route ends there)
        elif not self.update(waiters):  # (as _update_registrations would)
            del io._registered[self.fd]

    def end(self, closing: bool = False) -> None:
        """The fds leave trio's epoll; fileno() is exact again (``closing``:
        trio's notify_closing, a close follows: at its next call, not now,
        and the engine's interest is left as it is).  Also run by the
        socket's last close (then from any thread)."""
        if self.reading:
            self._remove(self.nfd)
            self.reading = False
        if self.live:
            self._remove(self.lfd)
            self.live = False
        loop = self.loop
        loop.waiting.pop(self, None)
        loop.unarmed.pop(self, None)
        loop.ended = max(loop.ended, self.last)
        if not closing and self.is_open():
            self.interest = POLLIN
            _ll.set_interest(self.h, POLLIN)
        sock = self.sock()
        if sock is not None:
            sock._loop_watches_fd(False, now=not closing, closer=self.end)


class _TrioNative:
    """An rsock fileno() trio waits on itself: a listener's (exact without
    the watcher thread), or a connection's on the TCP fallback."""

    __slots__ = ("sock",)

    def __init__(self, sock: _rs.socket) -> None:
        self.sock = weakref.ref(sock)


# id(trio's IO manager) -> its loop for the Watch (made at its first route)
_trio_loops: dict[int, _TrioLoop] = {}
# (id(IO manager), fileno()) -> that fd's route, or _TrioNative
_trio_routes: dict[tuple[int, int], _TrioRoute | _TrioNative] = {}
# guards _trio_marked, and a pass over _trio_routes (trio.run in several threads)
_trio_lock = threading.Lock()


def _trio_loop(io: Any) -> _TrioLoop:
    loop = _trio_loops.get(id(io))
    if loop is None or loop.io is not io:
        loop = _trio_loops[id(io)] = _TrioLoop(io)
    return loop


def _trio_route(io: Any, fd: int) -> _TrioRoute | None:
    """The route of ``fd`` in ``io``, made now if it is an rsock connection's
    fileno() (None: trio's own way).  A negative ``fd`` is a connection's
    own key (``_trio_wait_key``): its route while the connection is open."""
    key = (id(io), fd)
    route = _trio_routes.get(key)
    if fd < 0:
        if isinstance(route, _TrioRoute):
            if route.is_open():
                return route
            _trio_routes.pop(key, None)
            route.end()
        return None
    sock = _rs.live(fd)
    if route is not None:
        if route.sock() is sock:
            if isinstance(route, _TrioNative):
                return None
            if sock is not None and sock._h is route.h:  # (still open)
                return route
        _trio_routes.pop(key, None)  # its socket closed (the number may be another's now)
        if isinstance(route, _TrioRoute):
            route.end()
    if sock is None:
        return None
    keyed = _trio_routes.get((id(io), sock._trio_key)) if sock._trio_key else None
    if sock._is_listener() or sock._tcp is not None or keyed is not None:
        # (a wait on the number of a connection trio also waits on by its
        # key: trio's own, on fileno() made exact; one route per connection)
        if keyed is not None:
            _exact(sock)
        _trio_unmark(sock)
        _trio_routes[key] = _TrioNative(sock)
        return None
    try:
        route = _TrioRoute(_trio_loop(io), fd, sock)
    except OSError:
        _trio_unmark(sock)
        return None  # not connected yet: trio's own way this time
    _trio_unmark(sock)  # (the route holds its own)
    waiters = io._registered.get(fd)
    if waiters is not None and waiters.current_flags:
        # trio's own registration of the fd (an earlier wait) goes
        try:
            io._epoll.unregister(fd)
        except OSError:
            pass
        waiters.current_flags = 0
    _trio_routes[key] = route
    _note("trio:fileno_watch")
    return route


# the keys of connections trio waited on by the socket object with no
# fileno() made (_trio_wait_key): negative, so no fd ever has one
_trio_keys = itertools.count(-2, -1)


def _trio_wait_key(io: Any, sock: _rs.socket) -> int | None:
    """The int trio's bookkeeping knows a wait on ``sock`` by: the
    connection's own key, its route made now if need be, while it has no
    fileno() (none is made for the wait); None: its fileno(), trio's way."""
    key = sock._trio_key
    if sock._h is None:
        return None
    if not key:
        if sock._fileno_made() or sock._core.listening or not sock._core.connected:
            return None
        key = sock._trio_key = next(_trio_keys)
    k = (id(io), key)
    route = _trio_routes.get(k)
    if isinstance(route, _TrioRoute):
        if route.is_open():
            return key
        _trio_routes.pop(k, None)
        route.end()
    try:
        route = _TrioRoute(_trio_loop(io), key, sock)
    except OSError:
        return None
    _trio_unmark(sock)  # (the route holds its own)
    _trio_routes[k] = route
    _note("trio:fileno_watch")
    return key


def _trio_gone(io: Any, key: int) -> None:
    """trio's step for a wait whose fd was closed behind its back (its
    epoll refuses the fd): the waiters wake with EBADF, the entry goes.
    For a connection's key whose socket closed under a waiting task."""
    waiters = io._registered.pop(key, None)
    if waiters is not None and (waiters.read_task is not None or waiters.write_task is not None):
        from trio._core._io_common import wake_all

        wake_all(waiters, _ll.oserror(-errno.EBADF))


# the rsock sockets trio took (its _SocketType.__init__) and has not waited
# on yet: their fileno() is not kept exact meanwhile (as while routed), so a
# connection trio routes at its first wait never turns the watcher thread on
# and off (five system calls and its wake-ups, per connection)
_trio_marked: weakref.WeakSet[_rs.socket] = weakref.WeakSet()


def _trio_mark(sock: _rs.socket) -> None:
    if _rs.lazy_fd and sock._core.connected:
        return  # (its fileno() is lazy anyway: an accepted connection's)
    with _trio_lock:
        if _active and sock not in _trio_marked:
            _trio_marked.add(sock)
            sock._loop_watches_fd(True)


def _trio_unmark(sock: _rs.socket | None = None) -> None:
    """``sock``'s fileno() exact again, unless something else routes it
    (None: every marked socket's)."""
    if not _trio_marked:
        return
    with _trio_lock:
        if sock is None:
            socks = list(_trio_marked)
            _trio_marked.clear()
        elif sock in _trio_marked:
            _trio_marked.discard(sock)
            socks = [sock]
        else:
            return
    for s in socks:
        s._loop_watches_fd(False)


def _trio_end(io: Any, fd: int | None = None) -> None:
    """Ends ``io``'s route of ``fd`` (None: all of its routes)."""
    with _trio_lock:
        if fd is not None:  # (one look, not a pass over every run's routes)
            routes = [_trio_routes.pop((id(io), fd), None)]
        else:
            keys = [k for k in list(_trio_routes) if k[0] == id(io)]
            routes = [_trio_routes.pop(k, None) for k in keys]
    for route in routes:
        if isinstance(route, _TrioRoute):
            route.end(closing=fd is not None)
    if fd is None:
        _trio_loops.pop(id(io), None)
        _trio_unmark()


def _trio_end_all() -> None:
    """unpatch: every route ends, and a task that waits on one waits in
    trio's own way from now on (its methods are trio's again)."""
    with _trio_lock:
        routes = list(_trio_routes.values())
        _trio_routes.clear()
    for route in routes:
        if isinstance(route, _TrioRoute):
            route.end()
            io = route.loop.io
            fd = route.fd
            if fd < 0:  # waited by the connection's key: on its fileno() now
                waiters = io._registered.pop(fd, None)
                sock = route.sock()
                if waiters is None or (waiters.read_task is None and waiters.write_task is None):
                    continue
                fd = sock.fileno() if sock is not None else -1
                if fd < 0:
                    io._registered[route.fd] = waiters
                    _trio_gone(io, route.fd)
                    continue
                mine = io._registered[fd]
                for attr in ("read_task", "write_task"):
                    if getattr(mine, attr) is None:
                        setattr(mine, attr, getattr(waiters, attr))
            waiters = io._registered.get(fd)
            if waiters is not None:
                waiters.current_flags = 0
                io._update_registrations(fd)
    _trio_loops.clear()
    _trio_unmark()


def _wrap_trio_update_registrations(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def _update_registrations(self: Any, fd: int) -> None:
        route = _trio_route(self, fd)
        if route is not None:
            if not route.update(self._registered[fd]):
                del self._registered[fd]
        elif fd < 0:
            _trio_gone(self, fd)  # (a connection's key: its socket closed)
        else:
            original(self, fd)

    return _update_registrations


def _wrap_trio_process_events(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def process_events(self: Any, events: Any) -> None:
        if events:
            loop = _trio_loops.get(id(self))
            if loop is not None and loop.io is self:
                fds = loop.fds
                rest = []
                for ev in events:
                    what = ev[0]
                    if type(what) is _TrioRoute:  # (get_events': a route found ready)
                        what.fired(-1)
                        continue
                    route = fds.get(what)
                    if route is None or not route.fired(what):
                        rest.append(ev)
                events = rest
        original(self, events)

    return process_events


def _wrap_trio_get_events(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def get_events(self: Any, timeout: float) -> Any:
        loop = _trio_loops.get(id(self))
        if loop is not None and loop.io is self:
            if loop.unarmed:
                ready = loop.unarmed_ready()
                if ready:
                    return ready + list(original(self, 0))
            if timeout > 0:
                if (loop.waiting or loop.ended) and loop.thread == threading.get_ident():
                    start = time.monotonic()
                    events = loop.poll(timeout)
                    if events:
                        return events
                    timeout = max(0.0, timeout - (time.monotonic() - start))
                loop.arm_all()  # (trio sleeps now: the routes still waited on go in)
        return original(self, timeout)

    return get_events


def _wrap_trio_notify_closing(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def notify_closing(self: Any, fd: Any) -> None:
        if isinstance(fd, _rs.socket):
            key = fd._trio_key
            if key:  # waited on by its key: those waiters wake
                if (id(self), key) in _trio_routes:
                    _trio_end(self, key)
                if key in self._registered:
                    original(self, key)
            if not fd._fileno_made():
                return  # no fileno(): nobody waits on it (else made just for this)
        n = _fd_of(fd)
        if (id(self), n) in _trio_routes:
            _trio_end(self, n)
            fd = n  # (trio would ask the socket's fileno(): exact again then)
        original(self, fd)

    return notify_closing


def _wrap_trio_epoll_wait(original: Any) -> Callable[..., Any]:
    """trio's wait on a socket object asks its fileno(): for an rsock
    connection with none made yet, the connection's own key instead (see
    ``_trio_wait_key``)."""

    @_wraps(original)
    async def _epoll_wait(self: Any, fd: Any, attr_name: str) -> None:
        if type(fd) is _rs.socket and (type(self), "_update_registrations") in _installed:
            key = _trio_wait_key(self, fd)
            if key is not None:
                fd = key
        await original(self, fd, attr_name)

    return _epoll_wait


def _wrap_trio_wait_writable(original: Any) -> Callable[..., Any]:
    """trio's connect waits for the socket to turn writable after the
    EINPROGRESS of its non-blocking connect (then reads SO_ERROR).  An rsock
    connect that had completed at once (an rsock connection is up when
    connect() returns) needs no wait: a checkpoint only (no route made for
    it, no round of the loop).  Once: later waits are trio's."""

    @_wraps(original)
    async def wait_writable(self: Any, fd: Any) -> None:
        if isinstance(fd, _rs.socket) and fd._connected_at_once():
            from trio import lowlevel

            await lowlevel.checkpoint()
            return
        await original(self, fd)

    return wait_writable


def _wrap_trio_io_close(original: Any) -> Callable[..., Any]:
    @_wraps(original)
    def close(self: Any) -> None:
        _trio_end(self)
        original(self)

    return close


# keyed by method name, or "Class.name" where two hooked classes share a name
_WRAPPERS: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "__init__": _wrap_trio_socket_init,
    "_SocketType.close": _wrap_trio_socket_close,
    "Connection.__init__": _wrap_openssl_connection_init,
    "wakeup_on_signals": _wrap_trio_wakeup_on_signals,
    "WakeupSocketpair.close": _wrap_trio_wakeup_close,
    "EpollIOManager.close": _wrap_trio_io_close,
    "wait_writable": _wrap_trio_wait_writable,
    "_epoll_wait": _wrap_trio_epoll_wait,
    "_update_registrations": _wrap_trio_update_registrations,
    "process_events": _wrap_trio_process_events,
    "get_events": _wrap_trio_get_events,
    "notify_closing": _wrap_trio_notify_closing,
    "create_connection": _wrap_create_connection,
    "create_server": _wrap_create_server,
    "connect_accepted_socket": _wrap_connect_accepted_socket,
    "start_tls": _wrap_start_tls,
    "sendfile": _wrap_sendfile,
    "sock_connect": _wrap_sock_connect,
    "sock_sendall": _wrap_sock_sendall,
    "wrap_socket": _wrap_ssl_wrap_socket,
    "add_reader": _wrap_fd_method("add_reader", False, True),
    "add_writer": _wrap_fd_method("add_writer", True, True),
    "remove_reader": _wrap_fd_method("remove_reader", False, False),
    "remove_writer": _wrap_fd_method("remove_writer", True, False),
    **dict.fromkeys(_POLLS_FILENO, _wrap_polls_fileno),
}
