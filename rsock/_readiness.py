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
import os
import select
from collections.abc import Callable
from typing import Any

from rsock import _lowlevel as _ll
from rsock._paths import env_raw

POLLIN = _ll.POLLIN
POLLOUT = _ll.POLLOUT


# RSOCK_LOOP_POLL_US: how long an event loop polls a busy connection's ring
# (rsock.asyncio's poller, and trio's under rsock.patch())
_POLL_ENV = "RSOCK_LOOP_POLL_US"
# A little more than a synchronous Python client takes between requests (an
# httpx client against uvicorn: 200-250 us here), so a busy connection is
# polled through that gap (no wake-up per request: uvicorn+httpx
# keep-alive 1.05x-1.09x -> 1.25x-1.30x TCP, aiohttp and websockets new
# connections ~1.25x -> ~1.5x); peers slower than twice that stop being
# polled (the budget adapts, below), and an idle loop burns nothing.
_POLL_DEFAULT_US = 250
_POLL_MAX_US = 1_000_000
_POLL_SLICE_US = 25  # longest busy-poll between two looks at the loop's other work


_POLL_KEY = os.fsencode(_POLL_ENV)
# (the raw value last read, what it parsed to): read for every transport
_poll_seen: tuple[Any, int] = (None, _POLL_DEFAULT_US)


def _loop_poll_us() -> int:
    """``RSOCK_LOOP_POLL_US`` (0 .. 1 s, default 250; 0: no polling)."""
    global _poll_seen
    raw = env_raw(_POLL_KEY, _POLL_ENV)
    seen = _poll_seen
    if raw == seen[0]:
        return seen[1]
    us = _parse_poll_us(os.environ.get(_POLL_ENV))
    _poll_seen = (raw, us)
    return us


def _parse_poll_us(v: str | None) -> int:
    if v is None or v == "":
        return _POLL_DEFAULT_US
    try:
        us = int(v, 0)
    except ValueError:
        raise ValueError(f"{_POLL_ENV}={v!r} is not an integer") from None
    if not 0 <= us <= _POLL_MAX_US:
        raise ValueError(f"{_POLL_ENV}={v!r} is not within 0 .. {_POLL_MAX_US}")
    return us


class _Hub:
    """The rsock fds one event loop watches, behind one epoll fd of our own
    that the loop watches (made at the first, kept on the loop object).

    Registering an fd here is one ``epoll_ctl``; ``loop.add_reader`` of a
    new fd costs uvloop five system calls (libuv probes the fd with an add
    and a delete, sets it non-blocking, and adds it again at the next
    round) and three to remove, and a selector loop a selector update and
    a handle: per connection and side, twice (notify and liveness fds).
    When the hub's fd turns readable, one ``epoll_wait`` finds which of
    ours are, and their callbacks run there (a callback that raises goes
    to the loop's exception handler, as from its own reader).  Level
    triggered, as the loops' readers.  Every fd is removed before its
    socket closes it (``Watch.disarm``), so the hub never reports an fd
    number that means another file now."""

    __slots__ = ("_loop", "_ep", "_cbs", "_pid")

    def __init__(self, loop: Any, ep: select.epoll | None = None) -> None:
        """``ep``: an epoll instance the loop itself waits on (trio's), whose
        events for the hub's fds the loop hands to ``run`` instead of a
        reader on an epoll fd of the hub's own."""
        self._loop = loop
        self._ep = select.epoll() if ep is None else ep
        # fd -> (callback, its arguments, the watch that added it)
        self._cbs: dict[int, tuple[Callable[..., None], tuple[Any, ...], object]] = {}
        self._pid = _pid
        if ep is None:
            loop.add_reader(self._ep.fileno(), self._dispatch)

    def add(self, fd: int, owner: object, cb: Callable[..., None], *args: Any) -> None:
        try:
            self._ep.register(fd, select.EPOLLIN)
        except FileExistsError:  # (re-added by its watch, or stale: below)
            pass
        self._cbs[fd] = (cb, args, owner)

    def remove(self, fd: int, owner: object) -> None:
        """Removes ``fd`` if ``owner`` (the watch that added it) still has
        it: a socket closed under its watch gave its fd number to another
        connection, whose it is now."""
        entry = self._cbs.get(fd)
        if entry is None or entry[2] is not owner:
            return
        del self._cbs[fd]
        try:
            self._ep.unregister(fd)
        except OSError:  # closed already (then it left the set)
            pass

    def _dispatch(self) -> None:
        for fd, _ev in self._ep.poll(0, 256):
            self.run(fd)

    def run(self, fd: int) -> bool:
        """Runs ``fd``'s callback if it is one of the hub's: whether it was."""
        entry = self._cbs.get(fd)
        if entry is None:
            return False
        try:
            entry[0](*entry[1])
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler(
                {"message": f"Exception in callback {entry[0]!r}", "exception": exc}
            )
        return True


_pid = os.getpid()  # this process's (a hub of another is not ours)


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def _hub(loop: Any) -> Any:
    """The loop's hub (made now if it has none, or if it is the hub of
    the process this one forked from: an epoll instance is shared across
    fork), or the loop itself where it takes no attribute (its own
    readers then: ``add_reader``/``remove_reader``)."""
    h: _Hub | None = getattr(loop, "_rsock_hub", None)
    if h is not None and h._pid == _pid:
        return h
    try:
        h = _Hub(loop)
    except OSError:
        return _LoopReaders(loop)
    try:
        loop._rsock_hub = h
    except AttributeError:
        loop.remove_reader(h._ep.fileno())
        h._ep.close()
        return _LoopReaders(loop)
    return h


class _LoopReaders:
    """The hub's two methods as the loop's own readers."""

    __slots__ = ("_add", "_remove")

    def __init__(self, loop: Any) -> None:
        self._add = loop.add_reader
        self._remove = loop.remove_reader

    def add(self, fd: int, owner: object, cb: Callable[..., None], *args: Any) -> None:
        self._add(fd, cb, *args)

    def remove(self, fd: int, owner: object) -> None:
        self._remove(fd)


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

    def start(self, polled: bool = False) -> _ll.Handle:
        """Turns the notify fd's exact readiness on and reads the two fds;
        the handle.  ``polled``: in polling mode from the start (as
        ``set_polled`` would put it, without first making the notify fd
        readable for data that is already there).  ``OSError``: EBADF once
        closed, ENOTCONN if not a connection."""
        h = self._owned
        if h is None:
            raise _ll.oserror(-_errno.EBADF)
        self.handle = h
        if polled and _ll.set_polled(h, True) == 0:
            self._polled = True
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
        went), until the peer is gone for good (watched once out of polling
        mode: ``set_polled``).  Call again whenever the interest changes."""
        if interest != self._interest:
            self._interest = interest
            _ll.set_interest(self.handle, interest)
        self._want = interest > 0
        if self._polled:
            pass  # the loop's poller looks at the ring (set_polled)
        elif interest and not self._reading:
            _hub(loop).add(self.notify_fd, self, on_ready)
            self._reading = True
        elif not interest and self._reading:
            _hub(loop).remove(self.notify_fd, self)
            self._reading = False
        if not self._polled:
            self._watch_live(loop, on_ready)

    def quiet(self, keep: int = 0) -> None:
        """The interest down to ``keep`` (of what it was), the loop's readers
        kept: for a caller that waits again soon (trio waits once per call,
        and a reader usually comes back before the next data, so POLLIN is
        worth keeping); the notify fd reads idle meanwhile unless the socket
        is ready for what is kept."""
        interest = self._interest & keep if self._interest > 0 else 0
        if interest != self._interest:
            self._interest = interest
            _ll.set_interest(self.handle, interest)
        self._want = interest > 0

    def _watch_live(self, loop: Any, on_ready: Callable[[], None]) -> None:
        """The loop watches the liveness fd (if not yet, and not gone)."""
        if not self._live and self.live_fd >= 0:
            _hub(loop).add(self.live_fd, self, self._on_live, loop, on_ready)
            self._live = True

    def set_polled(self, loop: Any, on_ready: Callable[[], None], on: bool) -> None:
        """Polling mode on: the notify fd is neither armed nor watched (the
        caller polls the ring with ``_ll.SpinSet``, and calls ``on_ready``
        itself); off: the engine arms and makes the notify fd exact again,
        and ``loop`` watches it as ``arm`` left it.

        The liveness fd is watched from the first ``arm`` out of polling
        mode on: a connection polled from its start (``start(polled=True)``)
        and closed while still polled, as most short ones are, never
        registers it (two ``epoll_ctl`` less per connection).  A peer that
        dies meanwhile shows when the poller cools the connection (no
        activity for its budget, ``RSOCK_LOOP_POLL_US``), or to a sender
        within a millisecond of a send (the engine's own look at the
        liveness channel)."""
        if on == self._polled or not self._is_open():
            return
        self._polled = on
        if on and self._reading:
            _hub(loop).remove(self.notify_fd, self)
            self._reading = False
        _ll.set_polled(self.handle, on)
        if not on and self._want:
            _hub(loop).add(self.notify_fd, self, on_ready)
            self._reading = True
        if not on and self._interest >= 0:  # (armed before: in use)
            self._watch_live(loop, on_ready)

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
            _hub(loop).remove(self.live_fd, self)
            self._live = False
            self.live_fd = -1  # level-triggered hang-up: watch it no more
            on_ready()

    def disarm(self, loop: Any, interest: int | None = None) -> None:
        """Removes the loop's readers; then, if the socket is still open and
        ``interest`` is given, leaves the engine's interest at that."""
        self._want = False
        if self._reading:
            _hub(loop).remove(self.notify_fd, self)
            self._reading = False
        if self._live:
            _hub(loop).remove(self.live_fd, self)
            self._live = False
        if interest is not None and self._is_open():
            self._interest = interest
            _ll.set_interest(self.handle, interest)
