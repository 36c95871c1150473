"""One rsock connection's readiness as an event loop sees it: :class:`Watch`.

``fileno()`` polls like a TCP socket's, but keeping it exact between calls
takes the engine's watcher thread.  An event loop does without: the engine
keeps the connection's *notify fd* readable exactly while the socket is
ready for the events of its *interest* (POLLIN for data, EOF or an error;
POLLOUT while a send would not block), arming its notification and
re-polling before the fd can look idle, and a *liveness fd* turns readable
when the peer is gone.  ``rsock.asyncio``'s transport and ``rsock.patch``'s
``loop.sock_sendall`` both watch those two fds through a ``Watch`` (from
``rsock.socket.watch()``), never through the socket's internals.

Nothing here imports ``rsock._socket`` (the socket builds its watches).
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Callable
from typing import Any

from rsock import _lowlevel as _ll

POLLIN = _ll.POLLIN
POLLOUT = _ll.POLLOUT


class Watch:
    """The notify and liveness fds of one connection, and the loop readers
    on them.

    Nothing is watched until ``start()``; ``arm`` and ``disarm`` come
    after it.  Then ``handle`` and ``addr`` (the
    handle for ``rsock._fastcall``) are there for the caller's own non-blocking engine calls,
    which report ``-errno``: ``error(rc)`` is the exception the socket would
    raise for it."""

    __slots__ = (
        "handle",
        "_owned",
        "addr",
        "notify_fd",
        "live_fd",
        "_is_open",
        "_error",
        "_watch_on",
        "_watch_off",
        "_interest",
        "_reading",
        "_live",
        "_polled",
        "_want",
    )

    def __init__(
        self,
        handle: _ll.Handle | None,
        is_open: Callable[[], bool],
        error: Callable[[int], OSError],
        watch_on: Callable[[int], None],
        watch_off: Callable[[int], None],
    ) -> None:
        """Built by ``rsock.socket.watch()`` (``handle`` None: closed, or
        on the TCP path): ``is_open()`` tells whether that socket object
        still holds ``handle``; ``error`` and ``watch_on``/``watch_off``
        (what the engine keeps exact: ``_ll.WATCH_*``) are its own."""
        self._owned = handle
        self.addr = 0
        self.notify_fd = self.live_fd = -1
        self._is_open = is_open
        self._error = error
        self._watch_on = watch_on
        self._watch_off = watch_off
        self._interest = -1  # as last set through this watch (-1: never)
        self._reading = False  # a reader on notify_fd
        self._live = False  # a reader on live_fd
        self._polled = False  # polling mode: no reader on notify_fd
        self._want = False  # armed with an interest (a reader on notify_fd unless polled)

    def start(self) -> _ll.Handle:
        """Turns the notify fd's exact readiness on and reads the two fds;
        the handle.  ``OSError``: EBADF once closed, ENOTCONN if not a
        connection."""
        h = self._owned
        if h is None:
            raise _ll.oserror(-_errno.EBADF)
        self.handle = h
        self._watch_on(_ll.WATCH_NOTIFY)
        self.addr = h.addr
        self.notify_fd, self.live_fd = _ll.notify_fds(h)
        return h

    @property
    def fd(self) -> int:
        """The connection's ``fileno()`` (made now if it was not yet: an
        event loop that watches the notify fd never needs it), or -1."""
        h = self._owned
        if h is None or not self._is_open():
            return -1
        try:
            return _ll.fileno(h)
        except OSError:
            return -1

    def is_open(self) -> bool:
        """Does the socket object still hold this connection (not closed)?"""
        return self._is_open()

    def error(self, rc: int) -> OSError:
        """The exception for an engine call's ``-errno``, as the socket's."""
        return self._error(rc)

    def drop_fileno(self) -> None:
        """``fileno()`` need not be kept exact any more (the loop watches
        the notify fd now; no watcher-thread wake-ups for it)."""
        self._watch_off(_ll.WATCH_FD)

    def arm(self, loop: Any, on_ready: Callable[[], None], interest: int) -> None:
        """The engine keeps the notify fd readable while the socket is ready
        for ``interest`` (POLLIN and/or POLLOUT; 0: nothing), and ``loop``
        calls ``on_ready`` then; also when the liveness fd fires (the peer
        went), until the peer is gone for good.  Call again whenever the
        interest changes."""
        if interest != self._interest:
            self._interest = interest
            _ll.set_interest(self.handle, interest)
        self._want = interest > 0
        if self._polled:
            pass  # the loop's poller looks at the ring (set_polled)
        elif interest and not self._reading:
            loop.add_reader(self.notify_fd, on_ready)
            self._reading = True
        elif not interest and self._reading:
            loop.remove_reader(self.notify_fd)
            self._reading = False
        if not self._live and self.live_fd >= 0:
            loop.add_reader(self.live_fd, self._on_live, loop, on_ready)
            self._live = True

    def set_polled(self, loop: Any, on_ready: Callable[[], None], on: bool) -> None:
        """Polling mode on: the notify fd is neither armed nor watched (the
        caller polls the ring with ``_ll.SpinSet``, and calls ``on_ready``
        itself); off: the engine arms and makes the notify fd exact again,
        and ``loop`` watches it as ``arm`` left it.  The liveness fd stays
        watched either way."""
        if on == self._polled or not self._is_open():
            return
        self._polled = on
        if on and self._reading:
            loop.remove_reader(self.notify_fd)
            self._reading = False
        _ll.set_polled(self.handle, on)
        if not on and self._want:
            loop.add_reader(self.notify_fd, on_ready)
            self._reading = True

    def _on_live(self, loop: Any, on_ready: Callable[[], None]) -> None:
        # What the ring holds first: a peer that closed wrote its FIN there
        # before its liveness socket closed, and the caller, reading it,
        # usually closes and disarms (then nothing is left to check)
        on_ready()
        if not self._live:
            return
        # 0: not gone yet (a FIN may still come: verbs' CM hang-up can
        # overtake the last completions); the engine makes the fd readable
        # again when that grace ends, so it stays watched
        if not self._is_open() or _ll.check_peer(self.handle):
            loop.remove_reader(self.live_fd)
            self._live = False
            self.live_fd = -1  # level-triggered hang-up: watch it no more
            on_ready()

    def disarm(self, loop: Any, interest: int | None = None) -> None:
        """Removes the loop's readers; then, if the socket is still open and
        ``interest`` is given, leaves the engine's interest at that."""
        self._want = False
        if self._reading:
            loop.remove_reader(self.notify_fd)
            self._reading = False
        if self._live:
            loop.remove_reader(self.live_fd)
            self._live = False
        if interest is not None and self._is_open():
            self._interest = interest
            _ll.set_interest(self.handle, interest)
