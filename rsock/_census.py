"""Kernel TCP connections of this process that rsock did not make.

``python -m rsock run`` with ``--report`` or ``RSOCK_FALLBACK=strict``
starts this in every patched process.  A connection made outside Python's
``socket`` module (by a C extension: grpcio, pyzmq, libcurl, libpq; or by
``_socket.socket`` used directly) never meets the patch, so nothing else
counts it.  This finds them where the kernel keeps them: the process's fd
table (``/proc/self/fd``: ``socket:[inode]`` links).  A socket inode counts
once, as ``unseen:tcp``, when it is an AF_INET/AF_INET6 stream socket with
a peer (``getpeername`` answers: established or closing, never a listener,
a connect still under way or a socket never connected) and is none of:

* the kernel sockets of Python's ``socket`` module that the patched class
  made or adopted (``rsock._patch`` tells ``_made`` of each: the stdlib
  sockets of ``kernel:tcp`` and ``stdlib``, rsock's own kernel sockets, the
  reserving socket that carries a ``connect:tcp`` fallback, an ``accept:tcp``
  connection); their inodes are looked up then, only while this runs;
* a socket the process had when this started (inherited: its maker counts it);
* one counted already, by this process or, before a ``fork()``, its parent.

rsock's fast path holds no kernel TCP connection (unix sockets, eventfds,
memfds, and a kernel listener beside each rsock listener, which listens).

When: a daemon thread looks every second (longer when a look costs more
than 1 % of that: ~4 ms per 1,000 fds), started again in a fork child; and
a last look at exit (``atexit``; ``os._exit``, which is wrapped).  A
connection that lived less than a period in a process killed by a signal,
or that opened and closed between two looks, is missed.  Each connection
goes into the report's count file at once (``rsock._inherit``).  Under
``RSOCK_FALLBACK=strict`` the first look that finds some says so on stderr,
once per process.  Nothing here raises into the program; without ``/proc``
it finds nothing.
"""

from __future__ import annotations

import _socket
import atexit
import os
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, NoReturn

from rsock import _patch

KEY = "unseen:tcp"
PERIOD = 1.0  # seconds between two looks (at least)
_BUDGET = 100  # ... and at least this many times what the last look took

_OTHER = 0  # a socket that is no TCP stream socket
_LISTENER = 1  # a TCP listener (never a connection)

_active = False
_strict = False
_said = False  # strict: the message was written (once per process)
_lock = threading.Lock()  # one look at a time
_gen = 0  # looks begun
_known: dict[int, int] = {}  # inode of a socket of the socket module -> _gen when told
_later: deque[weakref.ref[Any]] = deque()  # such sockets whose fd was not made yet
_kinds: dict[int, int] = {}  # inode -> _OTHER / _LISTENER, while the fd table holds it
_ignored: set[int] = set()  # inodes at start, and connections counted
_stop = threading.Event()
_real_exit = os._exit


def _made(sock: Any) -> None:
    """rsock._patch: the patched class made or adopted ``sock``, a stdlib
    socket (its fd not made yet for a subclass's, before ``__init__``).
    Called in the program's threads: no lock (a dict store is atomic)."""
    try:
        fd = sock.fileno()
        if fd < 0:
            _later.append(weakref.ref(sock))
            return
        if sock.family in (_socket.AF_INET, _socket.AF_INET6):
            _known[os.fstat(fd).st_ino] = _gen  # (a socket: no I/O)
    except Exception:
        pass


def _resolve_later() -> None:
    """The inodes of the sockets ``_made`` met before their fd was made."""
    for _ in range(len(_later)):
        try:
            ref = _later.popleft()
        except IndexError:
            return
        sock = ref()
        if sock is None:
            continue
        try:
            fd = sock.fileno()
            if fd < 0:
                _later.append(ref)  # (not made yet, or closed: dropped when freed)
                continue
            _known[os.fstat(fd).st_ino] = _gen
        except Exception:
            continue


def _socket_inodes() -> dict[int, int] | None:
    """{inode: fd} of the sockets in this process's fd table, or None
    without /proc.  readlink only: it never reaches a file system."""
    try:
        d = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        out: dict[int, int] = {}
        for name in os.listdir(d):
            try:
                link = os.readlink(name, dir_fd=d)
            except OSError:
                continue  # (closed meanwhile)
            if link.startswith("socket:["):
                try:
                    out[int(link[8:-1])] = int(name)
                except ValueError:
                    continue
        return out
    finally:
        os.close(d)


def _look_at(fd: int, ino: int) -> int | tuple[Any, Any] | None:
    """The socket ``ino`` at ``fd``: _OTHER, _LISTENER, (local, peer) for a
    connected TCP socket, None for one not connected (or gone: look again)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        if os.readlink(f"/proc/self/fd/{dup}") != f"socket:[{ino}]":
            os.close(dup)  # (fd is another file by now)
            return None
        s = _socket.socket(fileno=dup)  # (the C type: the patch never sees it)
    except OSError:
        os.close(dup)
        return None
    try:
        if s.family not in (_socket.AF_INET, _socket.AF_INET6) or s.type != _socket.SOCK_STREAM:
            return _OTHER
        if s.getsockopt(_socket.SOL_SOCKET, _socket.SO_ACCEPTCONN):
            return _LISTENER
        try:
            peer = s.getpeername()
        except OSError:
            return None
        return s.getsockname(), peer
    except OSError:
        return None
    finally:
        s.close()


def _look(final: bool) -> None:
    """One look at the fd table; counts each new connection once."""
    global _gen, _kinds, _said
    if not (_lock.acquire(True, 2.0) if final else _lock.acquire(False)):
        return
    try:
        g0 = _gen
        _gen = g0 + 1
        _resolve_later()
        inodes = _socket_inodes()
        if inodes is None:
            return
        for ino, g in list(_known.items()):
            if g <= g0 and ino not in inodes:  # closed (its fd was made before the listing)
                _known.pop(ino, None)
        _ignored.intersection_update(inodes)
        _kinds = {ino: k for ino, k in _kinds.items() if ino in inodes}
        found: dict[int, tuple[Any, Any]] = {}
        for ino, fd in inodes.items():
            if ino in _known or ino in _ignored or ino in _kinds:
                continue
            what = _look_at(fd, ino)
            if isinstance(what, tuple):
                found[ino] = what
            elif what is not None:
                _kinds[ino] = what
        if not found:
            return
        # a socket the socket module is adopting right now (accept(),
        # fromfd()) is connected before _made hears of it: let the thread
        # that made it go on, then ask again
        time.sleep(0.02)
        _resolve_later()
        new = [(ino, ends) for ino, ends in found.items() if ino not in _known]
        for ino, _ in new:
            _ignored.add(ino)
            _patch._note(KEY)
        if new and _strict and not _said:
            _said = True
            _say([ends for _, ends in new])
    finally:
        _lock.release()


def _addr(a: Any) -> str:
    if isinstance(a, tuple) and len(a) >= 2:
        return f"[{a[0]}]:{a[1]}" if ":" in str(a[0]) else f"{a[0]}:{a[1]}"
    return str(a)


def _say(conns: list[tuple[Any, Any]]) -> None:
    n = len(conns)
    shown = ", ".join(f"{_addr(local)} -> {_addr(peer)}" for local, peer in conns[:8])
    if n > 8:
        shown += f", and {n - 8} more"
    try:
        sys.stderr.write(
            f"rsock: RSOCK_FALLBACK=strict: process {os.getpid()} has {n} kernel TCP "
            f"connection{'s' if n > 1 else ''} that rsock did not make ({shown}): made "
            "outside Python's socket module (by a C extension such as grpcio, pyzmq, "
            "libcurl or a database driver), which rsock cannot carry; a --report counts "
            f"them as {KEY} (said once per process)\n"
        )
        sys.stderr.flush()
    except Exception:
        pass


def _sample(stop: threading.Event) -> None:
    wait = PERIOD
    while not stop.wait(wait):
        began = time.monotonic()
        try:
            _look(False)
        except Exception:
            pass
        wait = max(PERIOD, _BUDGET * (time.monotonic() - began))


def _start_sampler() -> None:
    global _stop
    _stop = threading.Event()
    try:
        threading.Thread(target=_sample, args=(_stop,), name="rsock-census", daemon=True).start()
    except Exception:
        pass  # (no thread: the look at exit still counts what is open then)


def _at_exit() -> None:
    _stop.set()
    try:
        _look(True)
    except Exception:
        pass


def _exit(status: int, /) -> NoReturn:
    """``os._exit`` with a last look first (a fork child of multiprocessing
    leaves by it)."""
    _at_exit()
    _real_exit(status)


def _after_fork_in_child() -> None:
    global _lock, _said
    _lock = threading.Lock()  # (the sampler of the parent may have held it)
    _said = False  # a process of its own; what the parent counted stays counted
    _start_sampler()


def start(strict: bool) -> None:
    """Look at this process's connections from now to its exit."""
    global _active, _strict
    if _active:
        return
    _active, _strict = True, strict
    inodes = _socket_inodes()
    if inodes is None:
        return  # (no /proc: nothing to look at)
    _ignored.update(inodes)
    _patch.census = _made
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    os._exit = _exit  # type: ignore[assignment]  # (the same signature)
    _start_sampler()
