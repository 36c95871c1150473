"""``rsock.patch()`` and the pollers: a connection's ``fileno()`` is made
lazily (a stand-in fd, no socketpair, no watcher thread) and becomes exact the
moment something is about to poll it: ``select.select``, ``select.poll``,
``select.epoll``, the ``selectors`` classes, the loops' ``sock_recv``-like
methods.  An event loop's ``add_reader``/``add_writer`` watch the notify fd
instead (tornado's way).  Each behaviour runs against stdlib TCP too (the
oracle): a poller that was not told would sleep through the data."""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import errno
import gc
import os
import select
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

import rsock
from rsock import _patch

STD_SOCKET = socket.socket
KINDS = ["tcp", "rsock"]
LOOPS = ["asyncio", "uvloop"]


@pytest.fixture
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """ "rsock": patched, socket.socket makes rsock sockets; "tcp": not."""
    if request.param == "rsock":
        rsock.patch()
    try:
        yield request.param
    finally:
        rsock.unpatch()


def connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.socket()
        client.settimeout(10)
        client.connect(listener.getsockname())
        server, _ = listener.accept()
    server.settimeout(10)
    return client, server


@contextlib.contextmanager
def open_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """``connected_pair()``, both ends closed after."""
    client, server = connected_pair()
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def is_socketpair_end(fd: int) -> bool:
    """Is fd a connected socket (the exact fileno(), not the lazy stand-in,
    an unconnected one)?"""
    s = _socket.socket(fileno=os.dup(fd))
    try:
        s.getpeername()
        return True
    except OSError as e:
        assert e.errno == errno.ENOTCONN
        return False
    finally:
        s.close()


def send_later(sock: socket.socket, data: bytes, delay: float = 0.05) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(delay), sock.sendall(data)))
    t.start()
    return t


def wait_select(sock: socket.socket, timeout: float) -> bool:
    r, _, _ = select.select([sock], [], [], timeout)
    return bool(r)


def wait_select_fd(sock: socket.socket, timeout: float) -> bool:
    r, _, _ = select.select([sock.fileno()], [], [], timeout)
    return bool(r)


def wait_poll(sock: socket.socket, timeout: float) -> bool:
    p = select.poll()
    p.register(sock.fileno(), select.POLLIN)
    return bool(p.poll(timeout * 1000))


def wait_epoll(sock: socket.socket, timeout: float) -> bool:
    with select.epoll() as ep:
        ep.register(sock.fileno(), select.EPOLLIN)
        return bool(ep.poll(timeout))


def selector_waiter(cls: type[selectors.BaseSelector]) -> Callable[[socket.socket, float], bool]:
    def wait(sock: socket.socket, timeout: float) -> bool:
        with cls() as sel:
            sel.register(sock, selectors.EVENT_READ)
            return bool(sel.select(timeout))

    return wait


WAITERS = {
    "select": wait_select,
    "select-fd": wait_select_fd,
    "poll": wait_poll,
    "epoll": wait_epoll,
    "DefaultSelector": selector_waiter(selectors.DefaultSelector),
    "PollSelector": selector_waiter(selectors.PollSelector),
    "SelectSelector": selector_waiter(selectors.SelectSelector),
}


@pytest.mark.timeout_s(30)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("waiter", list(WAITERS))
def test_a_poller_sees_a_connection_whose_fileno_was_asked_before(kind: str, waiter: str) -> None:
    """fileno() first (an rsock connection's is lazy then), the poller after:
    it sees nothing, then the data the peer sends, then nothing again once
    read; the fd number never changes."""
    wait = WAITERS[waiter]
    client, server = connected_pair()
    try:
        fd = server.fileno()
        assert not wait(server, 0)
        sender = send_later(client, b"x")
        start = time.monotonic()
        assert wait(server, 10), "the poller slept through the data"
        assert time.monotonic() - start < 5
        sender.join()
        assert server.recv(10) == b"x"
        assert not wait(server, 0)
        assert server.fileno() == fd
        client.close()
        assert wait(server, 10)  # EOF
        assert server.recv(10) == b""
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_a_poller_calls_other_objects_fileno_as_the_stdlib_does(kind: str) -> None:
    """The patch never calls fileno() of an object it does not know: the
    poller's own call is the only one (CPython's test_select_mutated: each
    fileno() call there shortens the list select is going through)."""
    r, w = os.pipe()
    try:
        calls = []

        class Fd:
            def fileno(self) -> int:
                calls.append(1)
                if len(calls) == 1:
                    del watched[-1]
                return w

        watched: list[Any] = [Fd()] * 4
        assert select.select([], watched, [], 0) == ([], watched[:3], [])
        assert len(calls) == 3
        p = select.poll()
        p.register(Fd(), select.POLLOUT)
        assert p.poll(0) == [(w, select.POLLOUT)]
        with select.epoll() as ep:
            ep.register(Fd(), select.EPOLLOUT)
            assert ep.poll(0) == [(w, select.EPOLLOUT)]
        assert len(calls) == 5
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.timeout_s(30)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_a_tls_connection_polled_after_its_fileno_was_asked(kind: str) -> None:
    """A TLS socket's fileno() is its connection's: lazy too, and made exact
    when select() is given the TLS socket."""
    certs = Path(__file__).resolve().parents[2] / "tests" / "certs"
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs / "localhost.crt", certs / "localhost.key")
    client_ctx = ssl.create_default_context(cafile=str(certs / "localhost.crt"))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        done = threading.Event()

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as s:
                s.recv(10)
                time.sleep(0.05)
                s.sendall(b"late")
                done.wait(10)

        t = threading.Thread(target=serve)
        t.start()
        try:
            raw = socket.create_connection(listener.getsockname(), timeout=10)
            with client_ctx.wrap_socket(raw, server_hostname="localhost") as c:
                c.fileno()
                c.sendall(b"go")
                r, _, _ = select.select([c], [], [], 10)
                assert r == [c], "the poller slept through the data"
                assert c.recv(10) == b"late"
        finally:
            done.set()
            t.join(10)


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_a_fresh_fileno_reads_as_an_open_fd(kind: str) -> None:
    """CPython's test_ssl test_makefile_close checks that the fd is open so:
    a read of 0 bytes gives b"", and EBADF once the socket is closed."""
    client, server = connected_pair()
    fd = server.fileno()
    try:
        assert os.read(fd, 0) == b""
    finally:
        client.close()
        server.close()
    with pytest.raises(OSError) as e:
        os.read(fd, 0)
    assert e.value.errno == errno.EBADF


@pytest.mark.parametrize("kind", ["rsock"], indirect=True)
def test_a_connection_fileno_is_a_stand_in_until_polled(kind: str) -> None:
    """The fast path: no socketpair for a fileno() nobody polls, nor for
    one only checked without waiting (the engine answers a select or poll
    with timeout 0) or waited for alone by select or poll (the engine
    waits) or registered in an epoll level-triggered (the epoll watches the
    engine's notify fd); the first kernel poller that may wait on fileno()
    itself (an edge-triggered epoll, or a select or poll over other fds
    too) makes it one, on the same number."""
    client, server = connected_pair()
    try:
        fd = server.fileno()
        assert not is_socketpair_end(fd)
        assert select.select([server], [server], [server], 0) == ([], [server], [])
        assert select.select([server], [], [], 0.01) == ([], [], [])
        p = select.poll()
        p.register(server, select.POLLIN)
        assert p.poll(10) == []
        assert not is_socketpair_end(fd)
        with select.epoll() as ep:
            ep.register(server, select.EPOLLIN)
            assert ep.poll(0.01) == []
        assert not is_socketpair_end(fd)
        with select.epoll() as ep:
            ep.register(server, select.EPOLLIN | select.EPOLLET)
            assert ep.poll(0.01) == []
        assert server.fileno() == fd
        assert is_socketpair_end(fd)
    finally:
        client.close()
        server.close()


def test_rsock_fileno_exact_makes_it_exact_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RSOCK_FILENO", "exact")
    rsock.patch()
    try:
        client, server = connected_pair()
        with client, server:
            assert is_socketpair_end(server.fileno())
    finally:
        rsock.unpatch()


def test_rsock_fileno_takes_two_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RSOCK_FILENO", "sometimes")
    with pytest.raises(ValueError, match="RSOCK_FILENO='sometimes'"):
        rsock.patch()
    assert not _patch.is_patched()
    assert socket.socket is STD_SOCKET


def test_unpatch_puts_the_pollers_back() -> None:
    def state() -> list[Any]:
        return [
            select.select,
            select.poll,
            select.epoll,
            selectors.SelectSelector.__dict__["_select"],
            selectors.PollSelector._selector_cls,
            selectors.EpollSelector._selector_cls,
        ]

    before = state()
    rsock.patch()
    try:
        during = state()
        assert all(a is not b for a, b in zip(before, during, strict=True))
    finally:
        rsock.unpatch()
    assert all(a is b for a, b in zip(before, state(), strict=True))


@pytest.mark.parametrize("kind", ["rsock"], indirect=True)
def test_after_unpatch_a_lazy_fileno_turns_exact(kind: str) -> None:
    client, server = connected_pair()
    try:
        fd = server.fileno()
        rsock.unpatch()
        assert server.fileno() == fd
        assert is_socketpair_end(fd)
        sender = send_later(client, b"y")
        assert wait_select(server, 10)
        sender.join()
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("epoll", [select.epoll, "patched"])
def test_epoll_stand_in_behaves_as_the_stdlib_one(epoll: Any) -> None:
    """What code does with an epoll object, on the patch's own (which the
    stdlib's cannot be subclassed into)."""
    if epoll == "patched":
        rsock.patch()
    try:
        ep = select.epoll()
        assert not ep.closed and ep.fileno() >= 0
        assert not os.get_inheritable(ep.fileno())
        ep2 = select.epoll.fromfd(os.dup(ep.fileno()))
        r, w = os.pipe()
        try:
            ep.register(r, select.EPOLLIN)
            with pytest.raises(FileExistsError):
                ep.register(r)
            ep.modify(fd=r, eventmask=select.EPOLLIN | select.EPOLLOUT)
            assert ep.poll(0) == []
            os.write(w, b"z")
            assert ep.poll(timeout=1, maxevents=1) == [(r, select.EPOLLIN)]
            ep.unregister(r)
            with pytest.raises(FileNotFoundError):
                ep.unregister(r)
            with pytest.raises(TypeError):
                ep.register("not an fd")
        finally:
            os.close(r)
            os.close(w)
        with ep2:
            assert not ep2.closed
        assert ep2.closed
        ep.close()
        assert ep.closed
        with pytest.raises(ValueError):
            ep.poll(0)
    finally:
        rsock.unpatch()


# --------------------------------------------------------------------------- event loops


def run_on(loop_name: str, main: Callable[[], Any], timeout: float = 20) -> Any:
    coro = asyncio.wait_for(main(), timeout)
    return uvloop.run(coro) if loop_name == "uvloop" else asyncio.run(coro)


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_reader_on_a_fresh_fileno_runs_without_a_socketpair(kind: str, loop_name: str) -> None:
    """tornado's way (fileno(), then add_reader): the reader runs when the
    peer sends; on rsock the loop watches the notify fd, and fileno() stays
    a stand-in (no socketpair made, no watcher thread woken) until a poller
    asks, after the reader went."""
    client, server = connected_pair()
    server.setblocking(False)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fd = server.fileno()
        got: asyncio.Future[bytes] = loop.create_future()

        def readable() -> None:
            if not got.done():
                got.set_result(server.recv(10))

        loop.add_reader(fd, readable)
        sender = send_later(client, b"hello")
        assert await got == b"hello"
        sender.join()
        loop.remove_reader(fd)
        await asyncio.sleep(0.01)  # (the route ends at the loop's next round)
        if kind == "rsock":
            assert not is_socketpair_end(fd)
        assert not wait_select(server, 0)
        client.sendall(b"again")
        assert wait_select(server, 10)
        assert server.recv(10) == b"again"

    try:
        run_on(loop_name, main)
    finally:
        client.close()
        server.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_polled_fileno_stays_exact_after_a_loop_reader_went(kind: str, loop_name: str) -> None:
    """A poller of the program's own registered the fd before a loop's
    reader came and went: it still wakes for the data after."""
    client, server = connected_pair()
    server.setblocking(False)
    own = select.epoll()
    own.register(server.fileno(), select.EPOLLIN)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fd = server.fileno()
        got: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, lambda: got.done() or got.set_result(None))
        client.sendall(b"1")
        await got
        assert server.recv(10) == b"1"
        loop.remove_reader(fd)
        await asyncio.sleep(0.01)

    try:
        run_on(loop_name, main)
        assert own.poll(0) == []
        sender = send_later(client, b"2")
        assert own.poll(10) == [(server.fileno(), select.EPOLLIN)]
        sender.join()
        assert server.recv(10) == b"2"
    finally:
        own.close()
        client.close()
        server.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("loop_name", LOOPS)
@pytest.mark.parametrize("method", ["sock_recv", "sock_recv_into"])
def test_sock_recv_after_fileno_was_asked(kind: str, loop_name: str, method: str) -> None:
    """The loops' sock_recv waits on fileno() itself (uvloop in C): a lazy
    one is made exact first, so the data that comes later wakes it."""
    client, server = connected_pair()
    server.setblocking(False)
    server.fileno()

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        sender = send_later(client, b"late", delay=0.1)
        if method == "sock_recv":
            data = await loop.sock_recv(server, 10)
        else:
            buf = bytearray(10)
            data = bytes(buf[: await loop.sock_recv_into(server, buf)])
        sender.join()
        return data

    try:
        assert run_on(loop_name, main) == b"late"
    finally:
        client.close()
        server.close()


def _watcher_switches() -> int:
    """Context switches so far of rsock's watcher thread (0: none yet)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                d = dict(ln.split(":\t", 1) for ln in f.read().splitlines() if ":\t" in ln)
        except (FileNotFoundError, ProcessLookupError):
            continue  # (a thread that ended meanwhile)
        if d["Name"].strip() == "rsock-watch":
            n += int(d["voluntary_ctxt_switches"]) + int(d["nonvoluntary_ctxt_switches"])
    return n


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_a_kept_alive_connection_checked_with_poll_zero(kind: str) -> None:
    """A client that checks its kept-alive connection before each request
    with a fresh poll object and ``poll(0)`` (urllib3's wait_for_read,
    httpcore's is_socket_readable) sees what the stdlib shows: nothing
    while idle, POLLIN once the peer sent or closed, POLLOUT while a send
    fits, and POLLNVAL for a closed fd.  Under the patch the connection's
    fileno() stays lazy through those checks: the engine answers them, and
    no watcher thread wakes at each reply (it did, once per request: a
    thread wake-up on the client's CPU)."""
    client, server = connected_pair()
    try:
        fd = client.fileno()
        before = _watcher_switches()
        for i in range(50):
            p = select.poll()
            p.register(fd, select.POLLIN)
            assert p.poll(0) == []
            client.sendall(b"GET %03d" % i)
            assert server.recv(16) == b"GET %03d" % i
            server.sendall(b"reply %03d" % i)
            assert client.recv(16) == b"reply %03d" % i
        woke = _watcher_switches() - before
        p = select.poll()
        p.register(client, select.POLLIN | select.POLLOUT)  # (the object, as selectors do)
        assert p.poll(0) == [(fd, select.POLLOUT)]
        server.sendall(b"more")
        deadline = time.monotonic() + 10
        while p.poll(0) != [(fd, select.POLLIN | select.POLLOUT)]:
            assert time.monotonic() < deadline, p.poll(0)
        assert p.poll(None) == [(fd, select.POLLIN | select.POLLOUT)]  # ready: no wait
        p.modify(fd, select.POLLOUT)
        assert p.poll(0) == [(fd, select.POLLOUT)]
        p.unregister(fd)
        assert p.poll(0) == []
        with pytest.raises(KeyError):
            p.unregister(fd)
        assert client.recv(16) == b"more"
        p = select.poll()
        p.register(fd, select.POLLIN)
        server.close()
        deadline = time.monotonic() + 10
        while p.poll(0) != [(fd, select.POLLIN)]:  # EOF
            assert time.monotonic() < deadline, p.poll(0)
        if kind == "rsock":
            assert not is_socketpair_end(fd)  # still the stand-in: nothing made it exact
            assert woke <= 5, f"the watcher thread woke {woke} times in 50 requests"
        assert client.recv(16) == b""
        client.close()
        assert p.poll(0) == [(fd, select.POLLNVAL)]
    finally:
        client.close()
        server.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_select_zero_over_a_connection_and_a_pipe(kind: str) -> None:
    """``select.select(..., 0)`` over a connection (the object and its fd
    number) and a pipe answers as the stdlib's: the objects given, in their
    order, each list for itself; a select with a timeout that finds one
    ready returns at once.  Under the patch the connection's fileno() stays
    lazy (the engine answers for it) and no watcher thread wakes per reply."""
    client, server = connected_pair()
    r, w = os.pipe()
    try:
        fd = client.fileno()
        before = _watcher_switches()
        for _ in range(30):
            assert select.select([client, r], [], [], 0) == ([], [], [])
            client.sendall(b"q")
            assert server.recv(1) == b"q"
            server.sendall(b"a")
            assert client.recv(1) == b"a"
        woke = _watcher_switches() - before
        os.write(w, b"x")
        server.sendall(b"more")
        want = ([r, client, fd], [w, client], [])
        deadline = time.monotonic() + 10
        while select.select([r, client, fd], [w, client], [client], 0) != want:
            assert time.monotonic() < deadline
        start = time.monotonic()
        assert select.select([client], [], [], 5) == ([client], [], [])
        assert time.monotonic() - start < 1
        assert client.recv(16) == b"more"
        assert os.read(r, 1) == b"x"
        assert select.select([client, fd, r], [], [], 0) == ([], [], [])
        if kind == "rsock":
            assert not is_socketpair_end(fd)
            assert woke <= 5, f"the watcher thread woke {woke} times in 30 requests"
    finally:
        os.close(r)
        os.close(w)
        client.close()
        server.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize(
    "waiter", ["select", "select-fd", "poll", "PollSelector", "SelectSelector"]
)
def test_a_lone_connection_waited_for(kind: str, waiter: str) -> None:
    """A wait on one socket before each ``recv`` (telnetlib's select,
    multiprocessing.connection.wait's PollSelector, urllib3's
    wait_for_read): it reports the socket when data or EOF comes, nothing
    once the timeout ran out, and a signal handler runs during the wait
    without ending it (PEP 475), as the stdlib's.  Under the patch the
    engine waits for a lazy connection polled alone (select, poll): its
    fileno() stays lazy and the watcher thread never wakes (a kernel wait
    on the exact fd needed that thread's wake-up per event)."""
    import signal

    wait = WAITERS[waiter]
    client, server = connected_pair()
    try:
        fd = client.fileno()
        before = _watcher_switches()
        for i in range(30):
            sender = send_later(server, b"%03d" % i, delay=0.002)
            assert wait(client, 10)
            sender.join()
            assert client.recv(16) == b"%03d" % i
        woke = _watcher_switches() - before
        start = time.monotonic()
        assert not wait(client, 0.2)
        assert 0.18 <= time.monotonic() - start < 2
        ticks: list[int] = []
        old = signal.signal(signal.SIGALRM, lambda *a: ticks.append(1))
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            sender = send_later(server, b"late", delay=0.3)
            start = time.monotonic()
            assert wait(client, 10)
            assert 0.25 <= time.monotonic() - start < 5
            assert ticks == [1]
            sender.join()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert client.recv(16) == b"late"
        closer = threading.Timer(0.05, server.close)
        closer.start()
        assert wait(client, 10)  # EOF
        closer.join()
        assert client.recv(16) == b""
        if kind == "rsock":
            assert not is_socketpair_end(fd)
            assert woke <= 5, f"the watcher thread woke {woke} times in 30 waits"
    finally:
        client.close()
        server.close()


# --------------------------------------------------------------------------- epoll routes


def route_count(kind: str) -> int:
    """The epoll routes made so far (0 over TCP)."""
    return _patch.counters().get("epoll:fileno_watch", 0) if kind == "rsock" else 0


def poll_until(ep: Any, want: list[tuple[int, int]], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = ep.poll(0)
        if got == want:
            return
        assert time.monotonic() < deadline, got


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_epoll_level_triggered_reports_what_the_stdlib_does(kind: str) -> None:
    """A connection in an epoll, level-triggered (the selectors module's
    way): its fileno() is reported with the events it is ready for among
    those registered, as long as it is (level), in poll's order of
    arguments (timeout, maxevents), and an idle one times out.  Under the
    patch the epoll watches the engine's notify and liveness fds instead
    (a route): fileno() stays lazy, the watcher thread never wakes."""
    made = route_count(kind)
    with open_pair() as (client, server):
        fd = server.fileno()
        before = _watcher_switches()
        with select.epoll() as ep:
            ep.register(fd, select.EPOLLIN)
            assert ep.poll(0) == []
            start = time.monotonic()
            assert ep.poll(0.1) == []
            assert 0.09 <= time.monotonic() - start < 2
            for i in range(30):
                sender = send_later(client, b"%03d" % i, delay=0.002)
                assert ep.poll(10) == [(fd, select.EPOLLIN)]
                assert ep.poll(0) == [(fd, select.EPOLLIN)]  # level: still there
                sender.join()
                assert server.recv(16) == b"%03d" % i
                assert ep.poll(0) == []
            ep.modify(fd, select.EPOLLIN | select.EPOLLOUT)
            assert ep.poll(timeout=0, maxevents=1) == [(fd, select.EPOLLOUT)]
            ep.modify(fd, select.EPOLLIN | select.EPOLLRDNORM)
            client.sendall(b"x")
            poll_until(ep, [(fd, select.EPOLLIN | select.EPOLLRDNORM)])
            assert server.recv(1) == b"x"
            ep.modify(fd, 0)
            client.sendall(b"y")
            time.sleep(0.05)
            assert ep.poll(0) == []
            ep.modify(fd, select.EPOLLIN)
            poll_until(ep, [(fd, select.EPOLLIN)])
            assert server.recv(1) == b"y"
            ep.unregister(fd)
            client.sendall(b"z")
            time.sleep(0.05)
            assert ep.poll(0) == []
        assert server.recv(1) == b"z"
        if kind == "rsock":
            assert route_count(kind) == made + 1
            assert not is_socketpair_end(fd)
            woke = _watcher_switches() - before
            assert woke <= 5, f"the watcher thread woke {woke} times in 30 waits"


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_epoll_sees_eof_and_reset(kind: str) -> None:
    """The peer's close polls readable (EOF), and a reset (SO_LINGER 0)
    readable with an error and a hang-up, as a TCP socket's epoll shows."""
    import struct

    client, server = connected_pair()
    client2, server2 = connected_pair()
    try:
        with select.epoll() as ep:
            ep.register(server, select.EPOLLIN)
            ep.register(server2.fileno(), select.EPOLLIN)
            client.close()
            poll_until(ep, [(server.fileno(), select.EPOLLIN)])
            assert server.recv(1) == b""
            ep.unregister(server)
            client2.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client2.close()
            want = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
            poll_until(ep, [(server2.fileno(), want)])
            ep.modify(server2, select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP)
            want |= select.EPOLLOUT | select.EPOLLRDHUP
            assert ep.poll(0) == [(server2.fileno(), want)]
            with pytest.raises(ConnectionResetError):
                server2.recv(1)
    finally:
        for s in (client, server, client2, server2):
            s.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_epoll_registration_errors_and_close(kind: str) -> None:
    """What the stdlib's epoll raises: registering an fd twice, modifying or
    unregistering one that is not registered (FileNotFoundError), anything
    on a closed epoll (ValueError).  A socket closed while registered
    leaves the epoll (its fd is gone: unregister raises OSError), and its
    number may be registered again by the next socket."""
    client, server = connected_pair()
    try:
        fd = server.fileno()
        ep = select.epoll()
        ep.register(fd, select.EPOLLIN)
        with pytest.raises(FileExistsError):
            ep.register(fd, select.EPOLLIN)
        with pytest.raises(FileExistsError):
            ep.register(server)
        ep.unregister(server)
        with pytest.raises(FileNotFoundError):
            ep.unregister(fd)
        with pytest.raises(FileNotFoundError):
            ep.modify(fd, select.EPOLLIN)
        ep.register(fd)  # (the default mask: in, pri, out)
        assert ep.poll(0) == [(fd, select.EPOLLOUT)]
        client.sendall(b"a")
        poll_until(ep, [(fd, select.EPOLLIN | select.EPOLLOUT)])
        server.close()
        assert ep.poll(0) == []
        with pytest.raises(OSError):
            ep.unregister(fd)
        client.close()
        client, server = connected_pair()
        ep.register(server, select.EPOLLIN)  # (maybe fd's number again)
        client.sendall(b"b")
        poll_until(ep, [(server.fileno(), select.EPOLLIN)])
        ep.close()
        assert ep.closed
        with pytest.raises(ValueError):
            ep.poll(0)
        with pytest.raises(ValueError):
            ep.register(server)
        with pytest.raises(ValueError):
            ep.unregister(server)
        assert wait_select(server, 10)  # (the socket's own readiness, after the epoll)
        assert server.recv(1) == b"b"
    finally:
        client.close()
        server.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("flag", ["EPOLLET", "EPOLLONESHOT"])
def test_epoll_flags_a_route_does_not_keep(kind: str, flag: str) -> None:
    """Edge-triggered and one-shot registrations poll fileno() itself (made
    exact under the patch), with the kernel's semantics: an edge is
    reported once per arrival, a one-shot once until modified."""
    bit = getattr(select, flag)
    with open_pair() as (client, server):
        fd = server.fileno()
        with select.epoll() as ep:
            ep.register(fd, select.EPOLLIN | bit)
            client.sendall(b"1")
            assert ep.poll(10) == [(fd, select.EPOLLIN)]
            assert ep.poll(0.05) == []  # once
            if flag == "EPOLLONESHOT":
                ep.modify(fd, select.EPOLLIN | bit)
                assert ep.poll(10) == [(fd, select.EPOLLIN)]
            assert server.recv(1) == b"1"
            client.close()
            if flag == "EPOLLONESHOT":
                ep.modify(fd, select.EPOLLIN | bit)
            assert ep.poll(10) == [(fd, select.EPOLLIN)]
        if kind == "rsock":
            assert is_socketpair_end(fd)


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("poller", ["epoll", "poll"])
def test_rdhup_once_the_peer_shut_its_side(kind: str, poller: str) -> None:
    """EPOLLRDHUP (POLLRDHUP for poll) comes with the peer's FIN, also while
    its data is still unread, and not before; a route keeps it (fileno()
    stays lazy under the patch)."""
    with open_pair() as (client, server):
        fd = server.fileno()
        if poller == "epoll":
            p: Any = select.epoll()
            rdhup = select.EPOLLRDHUP
            p.register(fd, select.EPOLLIN | select.EPOLLOUT | rdhup)
        else:
            p = select.poll()
            rdhup = select.POLLRDHUP
            p.register(fd, select.POLLIN | select.POLLOUT | rdhup)
        out, inp = select.POLLOUT, select.POLLIN  # (the same bits as epoll's)
        assert p.poll(0) == [(fd, out)]
        client.sendall(b"last")
        poll_until(p, [(fd, inp | out)])
        client.shutdown(socket.SHUT_WR)
        poll_until(p, [(fd, inp | out | rdhup)])
        assert server.recv(16) == b"last"
        assert server.recv(16) == b""
        assert p.poll(0) == [(fd, inp | out | rdhup)]
        server.sendall(b"still")  # (the other way stays open)
        assert client.recv(16) == b"still"
        if poller == "epoll":
            p.close()
        if kind == "rsock":
            assert not is_socketpair_end(fd)


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_epoll_modify_to_edge_triggered(kind: str) -> None:
    """A level-triggered registration modified to edge-triggered (under the
    patch: the route ends, fileno() is made exact and takes its place).
    (Data that comes while earlier data is unread makes no new edge on
    rsock: see the README's differences.)"""
    with open_pair() as (client, server):
        fd = server.fileno()
        with select.epoll() as ep:
            ep.register(fd, select.EPOLLIN)
            client.sendall(b"1")
            assert ep.poll(10) == [(fd, select.EPOLLIN)]
            ep.modify(fd, select.EPOLLIN | select.EPOLLET)
            assert ep.poll(10) == [(fd, select.EPOLLIN)]
            assert ep.poll(0.05) == []
            assert server.recv(16) == b"1"
            client.sendall(b"2")
            assert ep.poll(10) == [(fd, select.EPOLLIN)]
            ep.unregister(fd)
            with pytest.raises(FileNotFoundError):
                ep.unregister(fd)
        assert server.recv(16) == b"2"


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_two_epolls_and_many_connections(kind: str) -> None:
    """Two epolls hold the same connection (under the patch the second
    polls fileno() made exact, the first keeps its route); maxevents
    bounds what one poll reports, the rest comes with the next."""
    pairs = [connected_pair() for _ in range(4)]
    try:
        ep1, ep2 = select.epoll(), select.epoll()
        with ep1, ep2:
            for _, s in pairs:
                ep1.register(s, select.EPOLLIN)
            ep2.register(pairs[0][1], select.EPOLLIN)
            for c, _ in pairs:
                c.sendall(b"m")
            fds = sorted(s.fileno() for _, s in pairs)
            deadline = time.monotonic() + 10
            while len(ep1.poll(0)) < 4:
                assert time.monotonic() < deadline
            assert sorted(ep1.poll(0)) == [(f, select.EPOLLIN) for f in fds]
            first = ep1.poll(0, 3)
            assert len(first) == 3
            assert ep2.poll(10) == [(pairs[0][1].fileno(), select.EPOLLIN)]
            for _, s in pairs:
                assert s.recv(1) == b"m"
            assert ep1.poll(0) == [] and ep2.poll(0) == []
            pairs[0][0].sendall(b"n")
            assert ep2.poll(10) == [(pairs[0][1].fileno(), select.EPOLLIN)]
            assert ep1.poll(10) == [(pairs[0][1].fileno(), select.EPOLLIN)]
    finally:
        for c, s in pairs:
            c.close()
            s.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", ["rsock"], indirect=True)
def test_an_epoll_dropped_unclosed_lets_its_connections_go(kind: str) -> None:
    """An epoll object the program drops without closing it: its routes end
    (the connection is lazy again, and a select waits on it as ever)."""
    import gc

    client, server = connected_pair()
    try:
        ep = select.epoll()
        ep.register(server, select.EPOLLIN)
        assert server._core.loop_fd == 1
        del ep
        gc.collect()
        assert server._core.loop_fd == 0
        assert not is_socketpair_end(server.fileno())
        sender = send_later(client, b"q")
        assert wait_epoll(server, 10)
        sender.join()
        assert server.recv(1) == b"q"
    finally:
        client.close()
        server.close()


def _check_sleeps(kind: str, budget_us: int, slept: int, n: int, what: str) -> None:
    """Under the patch, a busy-poll budget longer than the peer's gaps keeps
    the polling thread awake through them (it slept for at most a tenth of
    the ``n`` waits); with none it slept for at least half."""
    if kind != "rsock":
        return
    if budget_us:
        assert slept <= n // 10, f"slept {slept} times for {n} {what}"
    else:
        assert slept >= n // 2, f"slept only {slept} times for {n} {what}"


def _thread_sleeps() -> int:
    """Voluntary context switches of the calling thread so far."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
        fields = dict(ln.split(":\t", 1) for ln in f.read().splitlines() if ":\t" in ln)
    return int(fields["voluntary_ctxt_switches"])


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("budget_us", [0, 200_000])
def test_epoll_busy_polls_a_busy_connection(
    kind: str, budget_us: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's epoll over a connection whose client sends its next
    request 1 ms after each reply: the requests and replies are the
    stdlib's.  Under the patch, with ``RSOCK_LOOP_POLL_US`` longer than
    that gap the poll busy-polls the ring through it instead of putting
    the thread to sleep (it never sleeps); with 0 it sleeps for each."""
    import subprocess
    import sys

    monkeypatch.setenv("RSOCK_LOOP_POLL_US", str(budget_us))
    n = 100
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        patch = "import rsock; rsock.patch()" if kind == "rsock" else ""
        code = (
            f"import socket, time\n{patch}\n"
            f"c = socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}))\n"
            f"for i in range({n}):\n"
            "    time.sleep(0.001)\n"
            "    c.sendall(b'%03d' % i)\n"
            "    assert c.recv(3) == b'r%02d' % (i % 100)\n"
        )
        peer = subprocess.Popen([sys.executable, "-c", code])
        try:
            server, _ = listener.accept()
            with server, select.epoll() as ep:
                server.setblocking(False)
                ep.register(server, select.EPOLLIN)
                sleeps = -1
                for i in range(n):
                    assert ep.poll(10) == [(server.fileno(), select.EPOLLIN)]
                    if i == 0:
                        sleeps = _thread_sleeps()
                    assert server.recv(3) == b"%03d" % i
                    server.sendall(b"r%02d" % (i % 100))
                sleeps = _thread_sleeps() - sleeps
                assert peer.wait(30) == 0
        finally:
            peer.kill()
            peer.wait()
    _check_sleeps(kind, budget_us, sleeps, n, "polls")


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("budget_us", [0, 200_000])
@pytest.mark.parametrize("served_by", ["epoll", "blocking calls"])
def test_epoll_busy_polls_for_the_next_connection(
    kind: str, budget_us: int, served_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's epoll watches its listener (and, as the selectors
    documentation's server, each connection; or it serves each connection
    with blocking calls, as a thread-per-connection server's accept loop
    does), and a client makes a new connection 1 ms after each one it
    closed (connect, request, reply, close).  Under the patch, with
    ``RSOCK_LOOP_POLL_US`` longer than that gap, a poll after a connection
    ended or a listener accepted goes on polling (the listener, without
    waiting) and takes the next connection without the thread going to
    sleep in the poll; with 0 it sleeps there for each."""
    import subprocess
    import sys

    monkeypatch.setenv("RSOCK_LOOP_POLL_US", str(budget_us))
    n = 60
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        patch = "import rsock; rsock.patch()" if kind == "rsock" else ""
        code = (
            f"import socket, time\n{patch}\n"
            f"for i in range({n}):\n"
            "    time.sleep(0.001)\n"
            f"    with socket.create_connection(('127.0.0.1', {listener.getsockname()[1]})) as c:\n"
            "        c.sendall(b'%03d' % i)\n"
            "        assert c.recv(3) == b'r%02d' % (i % 100)\n"
        )
        peer = subprocess.Popen([sys.executable, "-c", code])
        slept = 0  # in the epoll's poll, after the first connection came

        def poll(ep: select.epoll) -> list[tuple[int, int]]:
            nonlocal slept
            before = _thread_sleeps()
            events = ep.poll(10)
            assert events, "nothing came within 10 s"
            if served or conns:
                slept += _thread_sleeps() - before
            return events

        try:
            with select.epoll() as ep:
                ep.register(listener, select.EPOLLIN)
                served = 0
                conns: dict[int, socket.socket] = {}
                while served < n:
                    for fd, _ev in poll(ep):
                        if fd == listener.fileno():
                            conn, _ = listener.accept()
                            if served_by == "epoll":
                                conn.setblocking(False)
                                conns[conn.fileno()] = conn
                                ep.register(conn, select.EPOLLIN)
                                continue
                            with conn:
                                conn.settimeout(10)
                                assert conn.recv(3) == b"%03d" % served
                                conn.sendall(b"r%02d" % (served % 100))
                                assert conn.recv(3) == b""
                            served += 1
                            continue
                        conn = conns[fd]
                        data = conn.recv(3)
                        if data:
                            assert data == b"%03d" % served
                            conn.sendall(b"r%02d" % (served % 100))
                        else:
                            ep.unregister(conn)
                            conns.pop(fd).close()
                            served += 1
                # nothing comes any more: the busy poll ends within its budget
                cpu = time.process_time()
                assert ep.poll(0.6) == []
                idle_cpu = time.process_time() - cpu
            assert peer.wait(30) == 0
        finally:
            peer.kill()
            peer.wait()
    assert idle_cpu < 0.4, f"{idle_cpu:.2f} s of CPU in a 0.6 s poll with nothing to do"
    _check_sleeps(kind, budget_us, slept, n, "connections")


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_epoll_registered_while_another_thread_polls(kind: str) -> None:
    """A connection registered while another thread waits in the epoll's
    poll wakes that poll when data comes (under the patch a route goes into
    the epoll at once when a poll waits, not at the next poll)."""
    with open_pair() as (client, server), select.epoll() as ep:
        got: list[list[tuple[int, int]]] = []
        waiter = threading.Thread(target=lambda: got.append(ep.poll(10)))
        waiter.start()
        time.sleep(0.05)  # (the waiter is in the kernel's poll now)
        ep.register(server, select.EPOLLIN)
        time.sleep(0.05)
        start = time.monotonic()
        client.sendall(b"w")
        waiter.join(15)
        assert got == [[(server.fileno(), select.EPOLLIN)]]
        assert time.monotonic() - start < 5
        assert server.recv(1) == b"w"


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_epoll_nested_in_another_poller(kind: str) -> None:
    """An epoll's own fd in another poller (a select on ``ep.fileno()``, as
    an epoll nested in a loop is waited for) turns readable when a
    connection in it has data, whenever it was registered."""
    with open_pair() as (client, server), open_pair() as (client2, server2):
        with select.epoll() as ep:
            ep.register(server, select.EPOLLIN)
            efd = ep.fileno()
            ep.register(server2, select.EPOLLIN)
            assert select.select([efd], [], [], 0.05) == ([], [], [])
            for c, s in ((client, server), (client2, server2)):
                c.sendall(b"n")
                assert select.select([efd], [], [], 10) == ([efd], [], [])
                assert ep.poll(0) == [(s.fileno(), select.EPOLLIN)]
                assert s.recv(1) == b"n"


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("poll_first", [False, True])
def test_a_program_exits_with_routes_in_an_open_epoll(poll_first: bool) -> None:
    """A program that ends with connections still in an epoll it never
    closed exits cleanly: status 0, nothing on stderr."""
    import subprocess
    import sys

    code = (
        "import select, socket, rsock\n"
        "rsock.patch()\n"
        "L = socket.socket(); L.bind(('127.0.0.1', 0)); L.listen()\n"
        "c = socket.create_connection(L.getsockname())\n"
        "s, _ = L.accept()\n"
        "ep = select.epoll()\n"
        "ep.register(s, select.EPOLLIN)\n"
        f"if {poll_first}: ep.poll(0.01)\n"
        "keep = (ep, s, c, L)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, b"")


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_two_epoll_objects_on_one_kernel_epoll(kind: str) -> None:
    """``select.epoll.fromfd`` of another epoll's fd (CPython's
    test_epoll.test_fromfd): what either registers, both report, with the
    connections' own fds."""
    with open_pair() as (client, server):
        with select.epoll() as ep:
            ep2 = select.epoll.fromfd(os.dup(ep.fileno()))
            ep2.register(server.fileno(), select.EPOLLIN | select.EPOLLOUT)
            ep2.register(client.fileno(), select.EPOLLIN | select.EPOLLOUT)
            want = sorted([(server.fileno(), select.EPOLLOUT), (client.fileno(), select.EPOLLOUT)])
            assert sorted(ep.poll(1, 4)) == want
            assert sorted(ep2.poll(0.9, 4)) == want
            client.sendall(b"f")
            want[want.index((server.fileno(), select.EPOLLOUT))] = (
                server.fileno(),
                select.EPOLLIN | select.EPOLLOUT,
            )
            deadline = time.monotonic() + 10
            while sorted(ep.poll(0)) != sorted(want):
                assert time.monotonic() < deadline
            assert sorted(ep2.poll(0)) == sorted(want)
            ep2.close()
        assert server.recv(1) == b"f"


def _cyclic_garbage(use: Callable[[socket.socket], None], rounds: int) -> int:
    """``use(client)`` on ``rounds`` fresh connections with the GC off: the
    objects only the GC could free after (the stdlib's pollers leave none)."""
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            with open_pair() as (client, _server):
                use(client)
        return gc.collect()
    finally:
        gc.enable()


def _poll_kept(client: socket.socket) -> None:
    # urllib3's and httpcore's dropped-connection check: a fresh poll object,
    # dropped with the connection still registered
    p = select.poll()
    p.register(client.fileno(), select.POLLIN)
    assert p.poll(0) == []


def _epoll_used(client: socket.socket) -> None:
    ep = select.epoll()
    ep.register(client.fileno(), select.EPOLLIN)
    assert ep.poll(0) == []
    ep.unregister(client.fileno())
    ep.close()


def _selector_used(client: socket.socket) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(client, selectors.EVENT_READ)
        assert sel.select(0) == []


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
@pytest.mark.parametrize("use", [_poll_kept, _epoll_used, _selector_used])
def test_pollers_leave_no_reference_cycle(kind: str, use: Callable[[socket.socket], None]) -> None:
    """The patched poll and epoll objects are freed as the stdlib's are, by
    reference counting: none left for the GC (a program that turns the GC
    off would keep each one forever)."""
    garbage = _cyclic_garbage(use, 50)
    assert garbage == 0, garbage


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_an_epoll_dropped_unclosed_closes_its_fd_at_once(kind: str) -> None:
    """An epoll object dropped without close() closes its kernel fd when
    its last reference goes, with a connection registered or not (the
    stdlib's dealloc): not at some later GC."""
    gc.disable()
    try:
        with open_pair() as (client, _server):
            for register in (False, True):
                ep = select.epoll()
                fd = ep.fileno()
                if register:
                    ep.register(client.fileno(), select.EPOLLIN)
                    assert ep.poll(0) == []
                del ep
                with pytest.raises(OSError) as e:
                    os.fstat(fd)
                assert e.value.errno == errno.EBADF
    finally:
        gc.enable()


def _handoff_server(
    sel: selectors.BaseSelector, listener: socket.socket, stop: threading.Event
) -> None:
    """cheroot's shape: this thread polls the selector; a worker thread
    serves each request and hands the connection back to the selector
    (``register`` from the worker while this thread waits in ``select``).
    Closes its connections when ``stop`` is set."""
    conns = []
    workers = []

    def serve(conn: socket.socket) -> None:
        data = conn.recv(100)
        if not data:
            conn.close()
            return
        conn.sendall(data)
        sel.register(conn, selectors.EVENT_READ, "conn")

    while not stop.is_set():
        for key, _ in sel.select(timeout=2.0):
            if key.data == "listener":
                conn, _ = listener.accept()
                conns.append(conn)
                sel.register(conn, selectors.EVENT_READ, "conn")
            else:
                sel.unregister(key.fileobj)
                workers.append(threading.Thread(target=serve, args=(key.fileobj,), daemon=True))
                workers[-1].start()
    for worker in workers:
        worker.join(10)
    for conn in conns:
        conn.close()


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_a_connection_registered_by_another_thread_is_seen_by_the_waiting_poll(kind: str) -> None:
    """A keep-alive connection handed back to the selector by a worker
    thread while the main thread waits in ``select(timeout=2)``: its next
    request is seen at once, not when the poll times out (the epoll's
    busy poll left such a registration out of the kernel's epoll: every
    second request took the whole timeout).  (A poll object sees it at
    its next poll only, as the stdlib's.)"""
    stop = threading.Event()
    with socket.socket() as listener, selectors.EpollSelector() as sel:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        sel.register(listener, selectors.EVENT_READ, "listener")
        server = threading.Thread(target=_handoff_server, args=(sel, listener, stop), daemon=True)
        server.start()
        slow = []
        with socket.create_connection(listener.getsockname(), timeout=10) as client:
            for i in range(20):
                start = time.monotonic()
                client.sendall(b"%02d" % i)
                assert client.recv(100) == b"%02d" % i
                took = time.monotonic() - start
                if took > 1.0:
                    slow.append(round(took, 2))
                time.sleep(0.005)
        stop.set()
        server.join(10)
    assert slow == [], f"requests that waited for the poll's timeout: {slow}"


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_a_registration_during_the_busy_poll_is_seen_by_it(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epoll's busy poll after an accept (a long one here, 0.5 s) and a
    connection registered by another thread in the middle of it, its data
    there: the poll reports it within the busy poll, and one that goes on
    into the kernel's wait has it in the epoll (it missed both, and waited
    for the whole timeout)."""
    monkeypatch.setenv("RSOCK_LOOP_POLL_US", "500000")
    with socket.socket() as listener, selectors.EpollSelector() as sel:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        sel.register(listener, selectors.EVENT_READ, "listener")
        with socket.create_connection(listener.getsockname(), timeout=10) as client:
            assert [k.data for k, _ in sel.select(5)] == ["listener"]
            conn, _ = listener.accept()  # (a busy poll follows a listener's accept)
            with conn:
                got: list[Any] = []
                poller = threading.Thread(target=lambda: got.append(sel.select(3.0)))
                start = time.monotonic()
                poller.start()
                time.sleep(0.05)
                sel.register(conn, selectors.EVENT_READ, "conn")
                client.sendall(b"x")
                poller.join(10)
                took = time.monotonic() - start
                assert [k.data for k, _ in got[0]] == ["conn"]
                assert took < 1.5, f"the poll saw the connection after {took:.2f} s"
