"""``rsock.patch()`` / ``rsock.unpatch()``: what gets dispatched where, and what
stays exactly as it was."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rsock
from rsock import _patch

STD_SOCKET = socket.socket


@pytest.fixture
def patched() -> Iterator[None]:
    rsock.patch()
    try:
        yield
    finally:
        rsock.unpatch()


def snapshot() -> dict[str, int]:
    return {k: id(v) for k, v in vars(socket).items()}


def close_all(*socks: Any) -> None:
    for s in socks:
        s.close()


# --------------------------------------------------------------------------- dispatch


STREAM_CALLS = [
    ((), {}),
    ((socket.AF_INET,), {}),
    ((socket.AF_INET, socket.SOCK_STREAM), {}),
    ((socket.AF_INET, socket.SOCK_STREAM, 0), {}),
    ((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP), {}),
    ((socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC), {}),
    ((), {"family": socket.AF_INET, "type": socket.SOCK_STREAM}),
    ((socket.AF_INET6, socket.SOCK_STREAM), {}),
    ((int(socket.AF_INET6), int(socket.SOCK_STREAM), -1, None), {}),
]


@pytest.mark.parametrize(("args", "kwargs"), STREAM_CALLS)
def test_tcp_stream_sockets_are_rsock(patched: None, args: Any, kwargs: Any) -> None:
    s = socket.socket(*args, **kwargs)
    try:
        assert isinstance(s, rsock.socket)
        assert s.type == socket.SOCK_STREAM
        assert s.family in (socket.AF_INET, socket.AF_INET6)
    finally:
        s.close()


OTHER_CALLS = [
    (socket.AF_UNIX, socket.SOCK_STREAM),
    (socket.AF_UNIX, socket.SOCK_DGRAM),
    (socket.AF_INET, socket.SOCK_DGRAM),
    (socket.AF_INET6, socket.SOCK_DGRAM),
    (socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK),
]


@pytest.mark.parametrize(("family", "kind"), OTHER_CALLS)
def test_other_sockets_stay_stdlib(patched: None, family: int, kind: int) -> None:
    with socket.socket(family, kind) as s:
        assert type(s) is STD_SOCKET
        assert s.family == family


def test_errors_are_the_stdlib_ones(patched: None) -> None:
    with pytest.raises(TypeError):
        socket.socket("inet")  # type: ignore[arg-type]
    with pytest.raises(OSError) as info:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_UDP)
    rsock.unpatch()
    with pytest.raises(OSError) as oracle:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_UDP)
    assert info.value.errno == oracle.value.errno


def test_fileno_adoption_socketpair_fromfd_stay_stdlib(patched: None) -> None:
    a, b = socket.socketpair()
    try:
        assert type(a) is STD_SOCKET and type(b) is STD_SOCKET
        c = socket.fromfd(a.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
        assert type(c) is STD_SOCKET
        c.close()
        with STD_SOCKET(socket.AF_INET, socket.SOCK_STREAM) as k:
            d = socket.socket(socket.AF_INET, socket.SOCK_STREAM, fileno=k.detach())
            assert type(d) is STD_SOCKET and d.family == socket.AF_INET
            d.close()
        a.sendall(b"ping")
        assert b.recv(4) == b"ping"
    finally:
        close_all(a, b)


def test_unix_listener_accepts_stdlib_sockets(patched: None, tmp_path: Path) -> None:
    path = str(tmp_path / "sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(path)
        srv.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as cli:
            cli.connect(path)
            conn, _ = srv.accept()  # wraps the new fd with socket.socket(fileno=...)
            with conn:
                assert type(conn) is STD_SOCKET
                cli.sendall(b"unix")
                assert conn.recv(4) == b"unix"


def test_udp_round_trip(patched: None) -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b,
    ):
        a.bind(("127.0.0.1", 0))
        b.settimeout(10)
        b.sendto(b"datagram", a.getsockname())
        a.settimeout(10)
        data, addr = a.recvfrom(100)
        assert data == b"datagram" and addr[1] == b.getsockname()[1]


def test_create_connection_and_create_server_give_rsock(patched: None) -> None:
    before = _patch.counters()
    with socket.create_server(("127.0.0.1", 0)) as srv:
        assert isinstance(srv, rsock.socket)
        srv.settimeout(10)
        with socket.create_connection(srv.getsockname(), timeout=10) as cli:
            conn, _ = srv.accept()
            with conn:
                assert isinstance(cli, rsock.socket) and isinstance(conn, rsock.socket)
                assert cli.provider == conn.provider == "shm"
                cli.sendall(b"fast")
                assert conn.recv(4) == b"fast"
    after = _patch.counters()
    assert after.get("connect:shm", 0) - before.get("connect:shm", 0) == 1
    assert after.get("accept:shm", 0) - before.get("accept:shm", 0) == 1


def test_rsock_internal_sockets_are_not_dispatched(patched: None) -> None:
    """rsock's own kernel sockets (address reservation, locality probe) stay
    stdlib even while the patch is on, else they would recurse."""
    before = _patch.counters()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(10)
        with socket.socket() as cli:
            cli.settimeout(10)
            cli.connect(srv.getsockname())
            conn, _ = srv.accept()
            conn.close()
    after = _patch.counters()
    assert after.get("rsock", 0) - before.get("rsock", 0) == 2
    assert after.get("stdlib", 0) == before.get("stdlib", 0)


# --------------------------------------------------------------------------- class


def test_isinstance_and_issubclass(patched: None) -> None:
    with socket.socket() as r, socket.socket(socket.AF_UNIX) as u:
        assert isinstance(r, socket.socket) and isinstance(u, socket.socket)
        assert issubclass(rsock.socket, socket.socket)
        assert issubclass(STD_SOCKET, socket.socket)
        assert not isinstance(object(), socket.socket)
        assert not issubclass(int, socket.socket)
        assert issubclass(socket.socket, STD_SOCKET)
        rsock.unpatch()
        assert not isinstance(r, socket.socket)
        assert isinstance(u, socket.socket)


def test_subclass_defined_under_patch_is_a_stdlib_socket(patched: None) -> None:
    """A subclass's sockets are stdlib ones; a new TCP one counts as
    kernel:tcp (PySocks' socksocket went over TCP unreported)."""

    class Mine(socket.socket):  # type: ignore[misc, valid-type]
        def hello(self) -> str:
            return "mine"

    before = _patch.counters().get("kernel:tcp", 0)
    with Mine(socket.AF_INET, socket.SOCK_STREAM) as s:
        assert type(s) is Mine and s.hello() == "mine"
        assert isinstance(s, STD_SOCKET) and isinstance(s, socket.socket)
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[0] == "127.0.0.1"
    assert _patch.counters().get("kernel:tcp", 0) == before + 1
    with STD_SOCKET(socket.AF_UNIX) as u:
        assert not isinstance(u, Mine)
    with Mine(socket.AF_UNIX, socket.SOCK_STREAM):
        pass
    assert _patch.counters().get("kernel:tcp", 0) == before + 1  # (not TCP)


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_methods_called_on_the_class(patched: None, family: str) -> None:
    """``socket.socket.recv(sock, n)`` and the rest called on the class (trio
    takes them so): the patched class answers for rsock sockets (tcp) and
    stdlib ones (unix) alike, as the stdlib class does for its own."""
    cls = socket.socket
    if family == "tcp":
        listener = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(listener.getsockname())
        assert isinstance(client, rsock.socket)
        server, addr = cls.accept(listener)
        assert isinstance(server, rsock.socket) and addr == client.getsockname()
    else:
        listener = None
        client, server = socket.socketpair()
        assert type(client) is STD_SOCKET
    try:
        assert cls.send(client, b"abc") == 3
        assert cls.recv(server, 10) == b"abc"
        cls.sendall(client, b"defg")
        buf = bytearray(10)
        assert cls.recv_into(server, buf) == 4 and buf[:4] == b"defg"
        assert cls.sendmsg(client, [b"h", b"ij"]) == 3
        assert cls.recvfrom(server, 10)[0] == b"hij"
        client.sendall(b"klm")
        assert cls.recvfrom_into(server, buf)[0] == 3 and buf[:3] == b"klm"
        client.sendall(b"no")
        assert cls.recvmsg(server, 10)[0] == b"no"
        client.sendall(b"pq")
        assert cls.recvmsg_into(server, [buf])[0] == 2 and buf[:2] == b"pq"
        with pytest.raises(TypeError):
            cls.recv(client)  # the method's own argument errors
        assert cls.recv.__name__ == "recv" and cls.recv.__doc__ == STD_SOCKET.recv.__doc__
    finally:
        close_all(client, server, *([listener] if listener else []))


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_os_sendfile_to_a_socket(patched: None, kind: str, tmp_path: Path) -> None:
    """``os.sendfile(sock.fileno(), ...)`` (pyftpdlib sends files so, and
    asyncio's sock_sendfile): into a kernel TCP socket (the oracle) and, under
    the patch, into an rsock connection: what is sent and returned, the
    file's position, and a non-blocking socket whose peer does not read."""
    data = os.urandom(3 << 20)
    path = tmp_path / "file"
    path.write_bytes(data)
    make = socket.socket if kind == "rsock" else STD_SOCKET
    listener = make()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = make()
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    assert isinstance(client, rsock.socket) == (kind == "rsock")
    got = bytearray()

    def drain(n: int) -> None:
        while len(got) < n:
            got.extend(server.recv(1 << 20))

    reader = threading.Thread(target=drain, args=(len(data) + 1000 + 10,))
    with open(path, "rb") as f:
        out = client.fileno()
        reader.start()
        assert os.sendfile(out, f.fileno(), None, len(data)) == len(data)  # blocking: all
        assert f.tell() == len(data)
        assert os.sendfile(out, f.fileno(), None, 10) == 0  # at EOF
        assert os.sendfile(out_fd=out, in_fd=f.fileno(), offset=5, count=1000) == 1000
        assert f.tell() == len(data)  # an offset leaves the position alone
        assert os.sendfile(out, f.fileno(), len(data) - 10, 100) == 10
        assert os.sendfile(out, f.fileno(), 0, 0) == 0
        reader.join(30)
        assert bytes(got) == data + data[5:1005] + data[-10:]
        client.setblocking(False)  # the peer reads no more: sends what fits, then EAGAIN
        sent = 0
        with pytest.raises(BlockingIOError):
            for _ in range(10_000):
                n = os.sendfile(out, f.fileno(), 0, len(data))
                assert 0 < n <= len(data)
                sent += n
        assert sent > 0
    close_all(client, server, listener)
    with pytest.raises(OSError):
        os.sendfile(out, 0, 0, 1)  # closed (or another file now): the original's error


def test_unpatch_restores_os_sendfile() -> None:
    original = os.sendfile
    rsock.patch()
    try:
        assert os.sendfile is not original
    finally:
        rsock.unpatch()
    assert os.sendfile is original


def test_trio_takes_rsock_sockets(tmp_path: Path) -> None:
    """trio wraps a socket only if ``type(sock) is socket.socket``; imported
    under the patch it takes rsock's (and stdlib ones made by the patched
    class), and calls the class's methods on them.  Imported before the
    patch it keeps its own check (a clear TypeError)."""
    out = run_patched(
        """
        import socket, trio, trio.socket
        async def main():
            listener = trio.socket.socket()
            await listener.bind(("127.0.0.1", 0))
            listener.listen()
            client = trio.socket.socket()
            await client.connect(listener.getsockname())
            server, _ = await listener.accept()
            await client.send(b"hello")
            print(type(server._sock).__module__, await server.recv(10))
            a, b = trio.socket.socketpair()
            await a.send(b"unix")
            print(type(b._sock).__name__, await b.recv(10))
            for s in (listener, client, server, a, b):
                s.close()
        trio.run(main)
        """,
        tmp_path,
    )
    assert out.split("\n")[:2] == ["rsock._socket b'hello'", "socket b'unix'"], out
    # a socket made before trio.run (rsock's signal wakeup pipe is set then):
    # trio finds no wakeup fd set (it warns of a collision otherwise), and
    # rsock's pipe is back after the run
    out = run_patched(
        """
        import signal, socket, warnings
        warnings.simplefilter("error")
        import trio
        from rsock import _lowlevel
        s = socket.socket()
        mine = _lowlevel._wakeup[1]
        async def main():
            await trio.sleep(0)
            theirs = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(theirs, warn_on_full_buffer=False)
            print(theirs not in (-1, mine))  # trio's, during the run
        trio.run(main)
        print(signal.set_wakeup_fd(-1) == mine)
        s.close()
        """,
        tmp_path,
    )
    assert out.split() == ["True", "True"], out
    out = run_patched(
        """
        import rsock
        rsock.unpatch()
        import trio, trio.socket
        rsock.patch()
        async def main():
            try:
                trio.socket.socket()
            except TypeError as e:
                print("TypeError", e)
        trio.run(main)
        """,
        tmp_path,
    )
    assert out.startswith("TypeError expected object of type 'socket.socket'"), out


_TRIO_WAITS = """
import os, select, sys, trio, trio.socket

def watcher_switches():  # context switches of rsock's watcher thread so far
    n = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            d = dict(line.split(":\\t", 1) for line in f.read().splitlines() if ":\\t" in line)
        if d["Name"].strip() == "rsock-watch":
            n += int(d["voluntary_ctxt_switches"]) + int(d["nonvoluntary_ctxt_switches"])
    return n

async def exactly(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = await sock.recv(n - len(buf))
        assert chunk, "EOF"
        buf += chunk
    return buf

async def pair(listener):
    client = trio.socket.socket()
    await client.connect(listener.getsockname())
    server, _ = await listener.accept()
    return client, server

async def main():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    client, server = await pair(listener)
    # round trips: under the patch trio waits on the notify fd, not on a
    # fileno() the watcher thread keeps exact (~2 wake-ups per round trip)
    before = watcher_switches()
    for i in range(300):
        await client.send(b"%04d" % i)
        await server.send(await exactly(server, 4))
        assert await exactly(client, 4) == b"%04d" % i
    print("round trips, watcher woken:", "few" if watcher_switches() - before < 30 else "often")
    # a reader and a writer wait on one socket at once; each wakes for its event
    total, sent, got = 32 << 20, 0, []
    async def writer():
        nonlocal sent
        chunk = b"w" * 65536
        while sent < total:
            sent += await client.send(chunk[: total - sent])
    async def reader():
        got.append(await client.recv(100))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        nursery.start_soon(reader)
        await trio.sleep(0.2)
        print("both wait:", sent < total, got == [])
        await server.send(b"ping")
        with trio.fail_after(10):
            while not got:
                await trio.sleep(0.01)
        print("reader woke:", got, "writer still waits:", sent < total)
        received = len(await exactly(server, total))
    print("writer done:", sent == total == received)
    # two readers at once: trio's BusyResourceError
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.recv, 10)
        await trio.sleep(0.01)
        try:
            await server.recv(10)
        except trio.BusyResourceError:
            print("busy")
        nursery.cancel_scope.cancel()
    # a cancelled wait, then a wait that gets its data
    with trio.move_on_after(0.05):
        await server.recv(10)
    await client.send(b"after")
    print("after a cancel:", await exactly(server, 5))
    # a wait ended by another task's close (trio.lowlevel.notify_closing)
    async def closed_under():
        try:
            await server.recv(10)
        except trio.ClosedResourceError:
            print("closed under a waiter")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(closed_under)
        await trio.sleep(0.05)
        server.close()
    # the peer's close wakes a waiter with EOF
    client2, server2 = await pair(listener)
    async def eof():
        print("EOF:", await server2.recv(10))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(eof)
        await trio.sleep(0.05)
        client2.close()
    server2.close()
    client.close()
    # a connection that outlives the run: its fileno() polls exactly again after it
    kept = await pair(listener)
    for _ in range(10):
        await kept[0].send(b"k")
        await exactly(kept[1], 1)
    listener.close()
    # unpatch() while a task waits on a routed connection: trio's own wait now
    import rsock
    async def waits_across_unpatch():
        print("across unpatch:", await exactly(kept[1], 2))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waits_across_unpatch)
        await trio.sleep(0.05)
        rsock.unpatch()
        await trio.sleep(0.05)
        await kept[0].send(b"up")
    return kept

client, server = [s._sock for s in trio.run(main)]
print("after the run, idle:", select.select([server], [], [], 0)[0] == [])
client.send(b"late")
print("after the run, data:", select.select([server], [], [], 5)[0] == [server], server.recv(10))
client.close()
server.close()
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_trio_waits(kind: str, tmp_path: Path) -> None:
    """trio waits on a socket's fileno() with its own epoll; under the patch
    an rsock connection's waits go to its notify fd instead (no watcher
    thread wake-up per event: trio's round trips ran at 0.75-0.8x TCP's),
    with trio's semantics kept: a reader and a writer at once,
    BusyResourceError, cancellation, notify_closing, EOF, and a fileno()
    that polls exactly again after the run.  TCP (plain Python) is the
    oracle."""
    out = run_as(kind, _TRIO_WAITS, tmp_path, timeout=60)
    assert out.splitlines() == [
        "round trips, watcher woken: few",
        "both wait: True True",
        "reader woke: [b'ping'] writer still waits: True",
        "writer done: True",
        "busy",
        "after a cancel: b'after'",
        "closed under a waiter",
        "EOF: b''",
        "across unpatch: b'up'",
        "after the run, idle: True",
        "after the run, data: True b'late'",
    ], out


_TRIO_CONNECT = """
import socket, sys, threading, trio
from rsock import _patch

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()

def echo():
    conn, _ = listener.accept()
    with conn:
        conn.sendall(conn.recv(10))

threading.Thread(target=echo).start()

async def main():
    s = trio.socket.socket()
    with s:
        await s.connect(listener.getsockname())
        print("connected, waited by a route:", any(k[1] == s.fileno() for k in _patch._trio_routes))
        print("SO_ERROR:", s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
        await s.send(b"ping")
        print("echo:", await s.recv(10))
        with trio.move_on_after(5):
            await trio.lowlevel.wait_writable(s)  # (connected long since: trio's own wait)
            print("writable")

trio.run(main)
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_trio_connect(kind: str, tmp_path: Path) -> None:
    """trio's non-blocking connect, then its wait for writable and SO_ERROR:
    an rsock connection that was up at once needs no wait (no route made for
    it: a checkpoint only); TCP (plain Python) is the oracle."""
    out = run_as(kind, _TRIO_CONNECT, tmp_path, timeout=60)
    assert out.splitlines() == [
        "connected, waited by a route: False",
        "SO_ERROR: 0",
        "echo: b'ping'",
        "writable",
    ], out


_TRIO_CLOSE = """
import os, socket, sys, threading, trio

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
got = []

def peer():  # echoes (the second connection's reply late), then reads to EOF
    for delay in (0, 0.05):
        conn, _ = listener.accept()
        with conn:
            data = conn.recv(10)
            threading.Event().wait(delay)
            conn.sendall(data)
            got.append(conn.recv(10))

threading.Thread(target=peer).start()

def fds():
    return len(os.listdir("/proc/self/fd"))

# rsock's fileno() fds made (under the patch; none with TCP)
from rsock import _lowlevel
made = []
_fileno = _lowlevel.fileno
_lowlevel.fileno = lambda h: made.append(h) or _fileno(h)

async def main():
    # a connection nobody ever waited on: its reply read when it was there
    s = trio.socket.socket()
    await s.connect(listener.getsockname())
    await s.send(b"ping")
    while True:
        try:
            print("echo:", s._sock.recv(10))
            break
        except BlockingIOError:
            await trio.sleep(0.01)  # (no wait on the fd itself)
    before = fds()
    s.close()
    print("closed:", s.fileno(), "fds freed:", before - fds() >= 1, "filenos made:", len(made))
    # one that waits for its reply (in trio's epoll once the poll is over)
    s = trio.socket.socket()
    await s.connect(listener.getsockname())
    await s.send(b"pong")
    print("waited:", await s.recv(10))
    s.close()
    print("closed:", s.fileno(), "filenos made:", len(made))

trio.run(main)
while len(got) < 2:
    threading.Event().wait(0.01)
print("peer read:", got)
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_trio_close(kind: str, tmp_path: Path) -> None:
    """trio's close of a connection nobody waited on, and of one a task
    waited on for its reply: under the patch neither ever had its fileno()
    made (no stand-in fd: trio's waits know the connection by its own key,
    see _trio_wait_key), and the peer reads EOF.  (A close under a waiting
    task: test_trio_waits.)  TCP is the oracle."""
    out = run_as(kind, _TRIO_CLOSE, tmp_path, timeout=60)
    assert out.splitlines() == [
        "echo: b'ping'",
        "closed: -1 fds freed: True filenos made: 0",
        "waited: b'pong'",
        "closed: -1 filenos made: 0",
        "peer read: [b'', b'']",
    ], out


_TRIO_ENDS = """
import functools, gc, resource, sys, threading, trio

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

async def idle(label):  # no CPU spent while nothing happens
    t0 = cpu()
    await trio.sleep(0.5)
    print(label, "spins" if cpu() - t0 > 0.25 else "idle")

async def main():
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]

    async def pair():
        c = await trio.open_tcp_stream("127.0.0.1", port)
        s = await listener.accept()
        async with trio.open_nursery() as nursery:  # each side waits once
            nursery.start_soon(s.send_all, b"1")
            await c.receive_some(10)
            nursery.start_soon(c.send_all, b"2")
            await s.receive_some(10)
        return c, s

    # the peer of an idle connection closes; nobody reads until later
    c, s = await pair()
    await s.aclose()
    await idle("peer closed, nobody reads:")
    print("then reads:", await c.receive_some(10))
    await c.aclose()
    # a connection dropped without a close: the GC closes it
    c, s = await pair()
    del c
    gc.collect()
    with trio.fail_after(5):
        print("dropped peer reads:", await s.receive_some(10))
    await s.aclose()
    # closed underneath trio (no notify_closing); the peer still sends
    c, s = await pair()
    c.socket._sock.close()
    try:
        await s.send_all(b"after")
    except trio.BrokenResourceError:
        pass
    await idle("closed underneath, peer sends:")
    await s.aclose()
    await listener.aclose()

trio.run(main)

# trio.run in threads: one closes its connections while another makes new ones
sys.setswitchinterval(1e-6)
ready, done, errors, port = threading.Event(), threading.Event(), [], []
churned = threading.Event()  # (the server stops only then: no reset of its last one)

async def server():
    async def echo(stream):
        async with stream:
            async for data in stream:
                await stream.send_all(data)
    async with trio.open_nursery() as nursery:
        ls = await nursery.start(functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        port.append(ls[0].socket.getsockname()[1])
        ready.set()
        await trio.to_thread.run_sync(churned.wait)
        nursery.cancel_scope.cancel()

async def holder():
    streams = [await trio.open_tcp_stream("127.0.0.1", port[0]) for _ in range(300)]
    for stream in streams:
        await stream.send_all(b"a")
        await stream.receive_some(1)
    for stream in streams:
        await stream.aclose()

async def churner():
    while not done.is_set():
        async with await trio.open_tcp_stream("127.0.0.1", port[0]) as stream:
            await stream.send_all(b"x")
            await stream.receive_some(1)

def thread(fn):
    try:
        trio.run(fn)
    except BaseException as e:
        errors.append(repr(e))
    finally:
        if fn is holder:
            done.set()
        elif fn is churner:
            churned.set()

threads = [threading.Thread(target=thread, args=(server,))]
threads[0].start()
ready.wait(10)
threads += [threading.Thread(target=thread, args=(f,)) for f in (holder, churner)]
for t in threads[1:]:
    t.start()
for t in threads:
    t.join(30)
print("threads:", errors, [t.is_alive() for t in threads])
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_trio_routes_end(kind: str, tmp_path: Path) -> None:
    """A routed connection's end, as trio programs meet it (found by running
    them): the peer of an idle connection closes (the notify fd
    stayed readable: a 100% CPU spin until someone read; httpx's pool on
    trio after hypercorn's keep-alive timeout), a stream dropped without a
    close (the route kept the socket alive: the peer never saw EOF), a socket
    closed underneath trio (its eventfd, which the peer holds too, stayed in
    trio's epoll: a spin), and trio.run in threads, one closing connections
    while another makes them (RuntimeError out of aclose and out of trio's
    teardown).  TCP (plain Python) is the oracle."""
    out = run_as(kind, _TRIO_ENDS, tmp_path, timeout=90)
    assert out.splitlines() == [
        "peer closed, nobody reads: idle",
        "then reads: b''",
        "dropped peer reads: b''",
        "closed underneath, peer sends: idle",
        "threads: [] [False, False, False]",
    ], out


_TRIO_POLLS = """
import resource, socket, sys, threading, trio

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()

def echo():  # a peer in another thread (blocking sockets)
    conn, _ = listener.accept()
    with conn:
        while data := conn.recv(100):
            conn.sendall(data)

threading.Thread(target=echo, daemon=True).start()

async def main():
    s = trio.socket.socket()
    await s.connect(listener.getsockname())
    for i in range(300):
        await s.send(b"%04d" % i)
        got = b""
        while len(got) < 4:
            got += await s.recv(4 - len(got))
        assert got == b"%04d" % i, got
    print("round trips: 300")
    try:
        from rsock import _patch
        spins = sum(loop.spins for loop in _patch._trio_loops.values())
    except ImportError:
        spins = -1
    print("polled:", spins, file=sys.stderr)
    # a wait with nobody sending: the poller stops, nothing spins
    t0 = cpu()
    with trio.move_on_after(0.5):
        await s.recv(10)
    print("idle wait:", "spins" if cpu() - t0 > 0.25 else "idle")
    s.close()

trio.run(main)
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_trio_polls_busy_connections(kind: str, tmp_path: Path) -> None:
    """trio about to sleep while a task waits on an rsock connection that
    was active within RSOCK_LOOP_POLL_US: the ring is busy-polled first,
    as rsock.asyncio's poller does (trio's 64 B round trips 0.89x -> 1.75x
    TCP's), and an idle wait costs no CPU.  TCP (plain Python)
    is the oracle of what the program sees."""
    proc = run_as_proc(kind, _TRIO_POLLS, tmp_path, timeout=60)
    assert proc.stdout.splitlines() == ["round trips: 300", "idle wait: idle"], proc.stdout
    if kind == "rsock":
        polled = int(proc.stderr.split("polled:")[1].split()[0])
        assert polled >= 150, proc.stderr  # most of the 300 waits ended by the poller


_TRIO_NEXT_CONNECTION = """
import subprocess, sys, threading, trio

def sleeps():  # voluntary context switches of this thread (trio's)
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
        return int(f.read().split("voluntary_ctxt_switches:")[1].split()[0])

N = 60
CLIENT = '''
{patch}
import socket, sys, time
for i in range(%d):
    time.sleep(0.001)
    with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as c:
        c.sendall(b"%%03d" %% i)
        assert c.recv(3) == b"r%%02d" %% i
''' % N

async def main():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(port)])
    before = -1
    for i in range(N):
        conn, _ = await listener.accept()
        if before < 0:
            before = sleeps()
        with conn:
            assert await conn.recv(3) == b"%03d" % i
            await conn.send(b"r%02d" % i)
            assert await conn.recv(3) == b""
    slept = sleeps() - before
    print("served:", N)
    print("slept:", slept, file=sys.stderr)
    listener.close()
    assert client.wait(30) == 0

trio.run(main)
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
@pytest.mark.parametrize("budget_us", [0, 200_000])
def test_trio_polls_for_the_next_connection(
    kind: str, budget_us: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trio server that serves one new connection after another (a
    client connects 1 ms after its last connection closed): with
    ``RSOCK_LOOP_POLL_US`` longer than that gap, trio's wait after a
    connection ended goes on polling its epoll (the listener) without
    sleeping, so the next connection is taken without the thread being
    woken; with 0 it sleeps for each.  TCP (plain Python) is the oracle of
    what the program sees."""
    monkeypatch.setenv("RSOCK_LOOP_POLL_US", str(budget_us))
    patch = "import rsock; rsock.patch()" if kind == "rsock" else ""
    code = _TRIO_NEXT_CONNECTION.replace("{patch}", patch)
    proc = run_as_proc(kind, code, tmp_path, timeout=60)
    assert proc.stdout.splitlines() == ["served: 60"], proc.stdout
    if kind == "rsock":
        slept = int(proc.stderr.split("slept:")[1].split()[0])
        if budget_us:
            assert slept <= 6, proc.stderr
        else:
            assert slept >= 30, proc.stderr


def test_reference_kept_past_unpatch_builds_stdlib_sockets() -> None:
    rsock.patch()
    kept = socket.socket
    rsock.unpatch()
    with kept(socket.AF_INET, socket.SOCK_STREAM) as s:
        assert type(s) is STD_SOCKET


# --------------------------------------------------------------------------- patch state


def test_unpatch_restores_the_module_exactly() -> None:
    before = snapshot()
    assert not rsock._patch.is_patched()
    rsock.patch()
    assert _patch.is_patched()
    assert socket.socket is not STD_SOCKET
    changed = {k for k, v in snapshot().items() if before.get(k) != v}
    assert changed == {"socket"}, changed
    rsock.unpatch()
    assert not _patch.is_patched()
    assert snapshot() == before
    assert socket.socket is STD_SOCKET


def test_idempotent() -> None:
    before = snapshot()
    rsock.unpatch()
    assert snapshot() == before
    rsock.patch()
    first = socket.socket
    rsock.patch()
    assert socket.socket is first
    rsock.unpatch()
    assert snapshot() == before
    rsock.unpatch()
    assert snapshot() == before


def test_patch_unpatch_from_many_threads() -> None:
    before = snapshot()
    errors: list[BaseException] = []
    made: list[Any] = []
    lock = threading.Lock()

    def toggler(n: int) -> None:
        try:
            for i in range(200):
                (rsock.patch if (i + n) % 2 else rsock.unpatch)()
        except BaseException as e:
            errors.append(e)

    def maker() -> None:
        try:
            for _ in range(100):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                assert isinstance(s, rsock.socket | STD_SOCKET)
                with lock:
                    made.append(s)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=toggler, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=maker) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    finally:
        rsock.unpatch()
        close_all(*made)
    assert not errors, errors
    assert snapshot() == before


# --------------------------------------------------------------------------- fresh imports


def run_as_proc(
    kind: str, code: str, tmp_path: Path, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``code`` run to a clean exit under ``python -m rsock run`` (kind
    "rsock") or plain Python (kind "tcp": the oracle); its output, both
    streams."""
    launcher = ["-m", "rsock", "run"] if kind == "rsock" else []
    proc = subprocess.run(
        [sys.executable, *launcher, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def run_as(kind: str, code: str, tmp_path: Path, timeout: float = 30) -> str:
    """``code``'s standard output (``run_as_proc``)."""
    return run_as_proc(kind, code, tmp_path, timeout).stdout


def run_patched(code: str, tmp_path: Path, timeout: float = 30) -> str:
    return run_as("rsock", code, tmp_path, timeout)


def test_stdlib_network_modules_import_and_work_under_patch(tmp_path: Path) -> None:
    """Imported for the first time while patched (ssl.SSLSocket then subclasses the
    patched class): the modules load, and AF_UNIX, UDP and socketpair code in them
    still runs on stdlib sockets."""
    out = run_patched(
        """
        import socket, sys
        import ssl, socketserver, http.server, http.client, xmlrpc.server, xmlrpc.client
        import asyncio, selectors, smtplib, ftplib, urllib.request, multiprocessing.connection
        import rsock
        assert issubclass(ssl.SSLSocket, socket.socket)
        with socket.socket() as s:
            assert isinstance(s, rsock.socket), type(s)

        # socketserver over AF_UNIX, with its makefile() based handler
        class Upper(socketserver.StreamRequestHandler):
            def handle(self):
                self.wfile.write(self.rfile.readline().upper())
        path = "unix.sock"
        with socketserver.UnixStreamServer(path, Upper) as srv:
            import threading
            t = threading.Thread(target=srv.handle_request)
            t.start()
            with socket.socket(socket.AF_UNIX) as c:
                c.connect(path)
                c.sendall(b"unix line\\n")
                assert c.makefile("rb").readline() == b"UNIX LINE\\n"
            t.join(10)

        # UDP through socketserver
        class Echo(socketserver.BaseRequestHandler):
            def handle(self):
                data, sock = self.request
                sock.sendto(data[::-1], self.client_address)
        with socketserver.UDPServer(("127.0.0.1", 0), Echo) as srv:
            assert not isinstance(srv.socket, rsock.socket)
            t = threading.Thread(target=srv.handle_request)
            t.start()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
                c.settimeout(10)
                c.sendto(b"udp", srv.server_address)
                assert c.recv(10) == b"pdu"
            t.join(10)

        # asyncio: its self-pipe is a socketpair; a unix-socket stream round trip
        async def main():
            async def handle(r, w):
                w.write((await r.readline()).upper())
                await w.drain()
                w.close()
            srv = await asyncio.start_unix_server(handle, "aio.sock")
            r, w = await asyncio.open_unix_connection("aio.sock")
            w.write(b"asyncio\\n")
            line = await asyncio.wait_for(r.readline(), 10)
            w.close()
            srv.close()
            await srv.wait_closed()
            return line
        assert asyncio.run(main()) == b"ASYNCIO\\n"

        # multiprocessing.connection over AF_UNIX
        with multiprocessing.connection.Listener("mp.sock", "AF_UNIX") as lst:
            t = threading.Thread(target=lambda: lst.accept().send("pickled"))
            t.start()
            with multiprocessing.connection.Client("mp.sock", "AF_UNIX") as cl:
                assert cl.recv() == "pickled"
            t.join(10)
        print("ok")
        """,
        tmp_path,
    )
    assert out.strip() == "ok"


@pytest.fixture(scope="module")
def cert() -> tuple[str, str]:
    """The test certificate for localhost shipped in tests/certs."""
    d = Path(__file__).resolve().parents[2] / "tests" / "certs"
    return str(d / "localhost.crt"), str(d / "localhost.key")


def test_tls_over_stdlib_sockets_under_patch(tmp_path: Path, cert: tuple[str, str]) -> None:
    """ssl, first imported under the patch, wraps stdlib sockets as before (TLS
    over an AF_UNIX socketpair)."""
    certfile, keyfile = cert
    out = run_patched(
        f"""
        import socket, ssl, threading
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain({certfile!r}, {keyfile!r})
        client_ctx = ssl.create_default_context(cafile={certfile!r})
        a, b = socket.socketpair()
        result = []
        def serve():
            with server_ctx.wrap_socket(a, server_side=True) as s:
                s.sendall(s.recv(100).upper())
        t = threading.Thread(target=serve)
        t.start()
        with client_ctx.wrap_socket(b, server_hostname="localhost") as c:
            assert isinstance(c, ssl.SSLSocket) and isinstance(c, socket.socket)
            c.sendall(b"tls")
            print(c.recv(100).decode(), c.version() is not None)
        t.join(10)
        """,
        tmp_path,
    )
    assert out.split() == ["TLS", "True"]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_asyncio_tcp_streams_under_patch(tmp_path: Path, loop: str) -> None:
    """asyncio (and uvloop) imported under the patch: ``start_server`` and
    ``open_connection`` go through rsock.asyncio (the loops' own transports
    would wait for writability, which rsock's fd never reports)."""
    if loop == "uvloop":
        importlib.import_module("uvloop")  # a test dependency: never skipped
    out = run_patched(
        f"""
        import asyncio
        from rsock import _patch
        async def main():
            async def handle(r, w):
                w.write((await r.readline()).upper())
                await w.drain()
                w.close()
            srv = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = srv.sockets[0].getsockname()[1]
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 3)
                w.write(b"tcp\\n")
                line = await asyncio.wait_for(r.readline(), 3)
                provider = w.get_extra_info("socket").provider
                w.close()
            finally:
                srv.close()
            return line.decode().strip(), provider
        if {loop!r} == "uvloop":
            import uvloop
            print(*uvloop.run(main()))
        else:
            print(*asyncio.run(main()))
        c = _patch.counters()
        print(c["asyncio:create_server"], c["asyncio:create_connection"], c["accept:shm"])
        """,
        tmp_path,
    )
    assert out.split() == ["TCP", "shm", "1", "1", "1"]


# --------------------------------------------------------------------------- counting


def _delta(before: dict[str, int]) -> dict[str, int]:
    after = _patch.counters()
    out = {k: after[k] - before.get(k, 0) for k in after}
    kinds = ("connect", "accept", "refused")
    return {k: v for k, v in out.items() if v and k.split(":")[0] in kinds}


def test_every_connection_counts_once_whatever_the_api(patched: None) -> None:
    """Non-blocking connects (connect_ex and connect raising EINPROGRESS, as
    tornado and selectors-driven clients make them), asyncio's
    create_connection and sock_connect: each connection counts once."""
    import asyncio
    import selectors

    before = _patch.counters()
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(10)
        addr = srv.getsockname()
        made = []
        for how in ("connect_ex", "connect"):
            c = socket.socket()
            c.setblocking(False)
            if how == "connect_ex":
                assert c.connect_ex(addr) in (0, 115)  # EINPROGRESS
            else:
                with pytest.raises(BlockingIOError):
                    c.connect(addr)
            with selectors.DefaultSelector() as sel:
                sel.register(c, selectors.EVENT_WRITE)
                assert sel.select(10)
            assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            made.append(c)
            made.append(srv.accept()[0])

        async def loop_side() -> None:
            loop = asyncio.get_running_loop()
            _, w = await asyncio.open_connection(*addr)
            made.append(await loop.run_in_executor(None, lambda: srv.accept()[0]))
            s = socket.socket()
            s.setblocking(False)
            await loop.sock_connect(s, addr)
            made.append(s)
            made.append(await loop.run_in_executor(None, lambda: srv.accept()[0]))
            w.close()
            await w.wait_closed()

        asyncio.run(loop_side())
        close_all(*made)
    assert _delta(before) == {"connect:shm": 4, "accept:shm": 4}


PLAIN_CLIENT = """\
import socket, sys
try:  # the reset may come before connect() returns, or before or after the send
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
    c.sendall(b"x")
    print(repr(c.recv(10)))
except OSError as e:
    print(type(e).__name__)
"""


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("mode", ["never", "strict"])
def test_plain_tcp_clients_of_a_listener(
    patched: None, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A plain TCP client (an unpatched process) of an rsock listener:
    accepted and counted as ``accept:tcp`` under RSOCK_FALLBACK=never, reset
    and counted as ``refused:tcp`` under ``strict`` (accept() goes on waiting
    for an rsock client), so that a report can prove every connection took
    the fast path."""
    monkeypatch.setenv("RSOCK_FALLBACK", mode)
    before = _patch.counters()
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        client = subprocess.Popen(
            [sys.executable, "-c", PLAIN_CLIENT, str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        try:
            srv.settimeout(2 if mode == "strict" else 10)
            if mode == "strict":
                with pytest.raises(TimeoutError):
                    srv.accept()
            else:
                conn, _ = srv.accept()
                with conn:
                    assert conn.provider == "tcp" and conn.recv(1) == b"x"
                    conn.sendall(b"ok")
            out, err = client.communicate(timeout=30)
        finally:
            client.kill()
            client.wait()
    if mode == "strict":
        assert out.strip() in ("ConnectionResetError", "BrokenPipeError", "b''"), err
        assert _delta(before) == {"refused:tcp": 1}
    else:
        assert out.strip() == "b'ok'"
        assert _delta(before) == {"accept:tcp": 1}


def test_wrapping_an_rsock_tls_socket_again_is_refused(patched: None) -> None:
    """SSLContext.wrap_socket() of an rsock.SSLSocket raises ValueError and
    leaves the connection working (was: the stdlib built an SSLSocket on the
    rsock fileno, owned it and closed it under rsock, so an unrelated fd that
    reused the number was closed later: test_ftplib's server thread died of
    EBADF).  rsock only: the stdlib would wrap its own SSLSocket's fd again."""
    import ssl

    certs = Path(__file__).resolve().parent.parent.parent / "tests" / "certs"
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs / "localhost.crt", certs / "localhost.key")
    client_ctx = ssl.create_default_context(cafile=str(certs / "localhost.crt"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        raw = socket.create_connection(listener.getsockname(), timeout=10)
        conn, _ = listener.accept()
        result: list[Any] = []
        t = threading.Thread(
            target=lambda: result.append(server_ctx.wrap_socket(conn, server_side=True))
        )
        t.start()
        client = client_ctx.wrap_socket(raw, server_hostname="localhost")
        t.join(10)
        server = result[0]
        with client, server:
            assert isinstance(client, rsock.SSLSocket)
            fd = client.fileno()
            with pytest.raises(ValueError, match="already uses TLS"):
                client_ctx.wrap_socket(client, server_hostname="localhost")
            assert client.fileno() == fd
            client.sendall(b"still here")
            assert server.recv(10) == b"still here"


_TLS_IS_SSLSOCKET = """
{imports_first}
import socket, ssl, sys, threading
import httpcore
from websockets.sync.client import connect
from websockets.sync.server import serve

server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server_ctx.load_cert_chain({certfile!r}, {keyfile!r})
server_ctx.set_alpn_protocols(["h2", "http/1.1"])
client_ctx = ssl.create_default_context(cafile={certfile!r})

# httpcore's sync backend reads ALPN from an ssl.SSLSocket's _sslobj only (httpx's
# HTTP/2 client spoke HTTP/1.1 to an h2 server when it was not one)
with socket.create_server(("127.0.0.1", 0)) as listener:
    seen = []
    def serve_one():
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            seen.append((isinstance(tls, ssl.SSLSocket), tls.selected_alpn_protocol()))
            tls.recv(1)
    t = threading.Thread(target=serve_one)
    t.start()
    client_ctx.set_alpn_protocols(["h2", "http/1.1"])
    stream = httpcore.SyncBackend().connect_tcp("127.0.0.1", listener.getsockname()[1], timeout=10)
    stream = stream.start_tls(client_ctx, server_hostname="localhost", timeout=10)
    ssl_object = stream.get_extra_info("ssl_object")
    alpn = ssl_object is not None and ssl_object.selected_alpn_protocol()
    stream.write(b"x")
    t.join(10)
    stream.close()
    print("server", *seen[0])
    print("httpcore", alpn)

# websockets' threaded server asserts that a TLS connection is an ssl.SSLSocket
# (it closed every one before the handshake)
client_ctx = ssl.create_default_context(cafile={certfile!r})
def echo(ws):
    for message in ws:
        ws.send(message)
# (no TLS 1.3 session tickets: with them the TCP oracle itself stalled in the
# opening handshake about once in 20 runs: websockets' threads read
# and write one TLS socket at once; 0 in 100 without)
server_ctx.num_tickets = 0
with serve(echo, "127.0.0.1", 0, ssl=server_ctx) as server:
    t = threading.Thread(target=server.serve_forever)
    t.start()
    port = server.socket.getsockname()[1]
    # (a generous handshake timeout: the TCP oracle's timed out at websockets'
    # 10 s default twice in a loaded full-suite run)
    with connect(f"wss://localhost:{{port}}", ssl=client_ctx, open_timeout=60) as ws:
        ws.send(b"m" * 100000)
        print("websockets", len(ws.recv(timeout=10)))
    server.shutdown()
    t.join(10)
with socket.socket() as plain:
    tls_class = issubclass(type(ws.socket), ssl.SSLSocket)
    print("issubclass", tls_class, isinstance(plain, ssl.SSLSocket))
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock", "rsock.patch()"])
def test_tls_sockets_are_ssl_sslsockets(kind: str, tmp_path: Path, cert: tuple[str, str]) -> None:
    """While patched, rsock's TLS sockets are instances of ``ssl.SSLSocket``,
    as the stdlib's are over TCP: httpcore's sync HTTP/2 negotiation (ALPN)
    and websockets' threaded TLS server work as over TCP, under ``rsock run``
    and after ``rsock.patch()`` called before ssl's first import."""
    certfile, keyfile = cert
    first = "import rsock; rsock.patch()" if kind == "rsock.patch()" else ""
    code = _TLS_IS_SSLSOCKET.format(imports_first=first, certfile=certfile, keyfile=keyfile)
    out = run_as("rsock" if kind == "rsock" else "tcp", code, tmp_path, timeout=120)
    assert out.split("\n") == [
        "server True h2",
        "httpcore h2",
        "websockets 100000",
        "issubclass True False",
        "",
    ], out


_PASS_CONNECTION_FD = """
import errno, os, socket
from multiprocessing import reduction

srv = socket.create_server(("127.0.0.1", 0))
cli = socket.create_connection(srv.getsockname())
conn, _ = srv.accept()
for way in ("send_fds", "sendfds"):
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # a pre-fork worker: adopt the connection, answer one line
        a.close()
        fds = socket.recv_fds(b, 1, 1)[1]
        if fds:
            c = socket.socket(fileno=fds[0])
            c.settimeout(10)
            c.sendall(b"echo " + c.recv(100))
            c.close()
        os._exit(0)
    b.close()
    try:
        if way == "send_fds":
            socket.send_fds(a, [b"x"], [conn.fileno()])
        else:
            reduction.sendfds(a, [conn.fileno()])
    except OSError as e:
        assert "cannot be passed to another process" in str(e), e
        print(way, "refused", e.errno == errno.EOPNOTSUPP)
    else:
        cli.settimeout(10)
        cli.sendall(b"hello")
        print(way, cli.recv(100).decode())
    a.close()
    os.waitpid(pid, 0)
# a listener's fileno() still passes (adopted as a listener by a child)
a, b = socket.socketpair()
socket.send_fds(a, [b"x"], [srv.fileno()])
print("listener", len(socket.recv_fds(b, 1, 1)[1]))
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_a_connection_fd_handed_to_another_process(kind: str, tmp_path: Path) -> None:
    """A pre-fork server that hands an accepted connection's fd to a worker
    (SCM_RIGHTS: socket.send_fds, multiprocessing.reduction.sendfds): over
    TCP the worker answers; an rsock connection cannot travel (README,
    differences), and the send now fails with a clear error in the sender
    (the worker read rsock's readiness bytes as data, and the client was
    never answered)."""
    out = run_as(kind, _PASS_CONNECTION_FD, tmp_path, timeout=60)
    if kind == "tcp":
        assert out.split("\n") == ["send_fds echo hello", "sendfds echo hello", "listener 1", ""]
    else:
        assert out.split("\n") == [
            "send_fds refused True",
            "sendfds refused True",
            "listener 1",
            "",
        ]


_PYOPENSSL_ON_SOCKETS = """
import errno, socket, threading
from OpenSSL import SSL

server_ctx = SSL.Context(SSL.TLS_METHOD)
server_ctx.use_certificate_file({certfile!r})
server_ctx.use_privatekey_file({keyfile!r})
client_ctx = SSL.Context(SSL.TLS_METHOD)
with socket.create_server(("127.0.0.1", 0)) as listener:
    out = {{}}
    def serve():
        conn, _ = listener.accept()  # (blocking: pyOpenSSL's fd I/O)
        try:
            tls = SSL.Connection(server_ctx, conn)
        except OSError as e:
            out["server"] = errno.errorcode[e.errno]
            conn.close()
            return
        tls.set_accept_state()
        tls.do_handshake()
        tls.sendall(tls.recv(100).upper())
        tls.shutdown()
        out["server"] = "ok"
        conn.close()
    t = threading.Thread(target=serve)
    t.start()
    sock = socket.create_connection(listener.getsockname())
    try:
        tls = SSL.Connection(client_ctx, sock)
    except OSError as e:
        client = errno.errorcode[e.errno]
    else:
        tls.set_connect_state()
        tls.do_handshake()
        tls.sendall(b"ping")
        client = tls.recv(100).decode()
    t.join(20)
    sock.close()
    print("client", client, "server", out.get("server"))

    # memory BIOs (as Twisted uses pyOpenSSL) work on any socket
    def serve_bio():
        conn, _ = listener.accept()
        conn.settimeout(10)
        tls = SSL.Connection(server_ctx, None)
        tls.set_accept_state()
        pump(tls, conn, lambda: tls.do_handshake())
        data = pump(tls, conn, lambda: tls.recv(100))
        tls.send(data.upper())
        conn.sendall(tls.bio_read(65536))
        conn.close()
    def pump(tls, sock, step):
        while True:
            try:
                return step()
            except SSL.WantReadError:
                try:
                    pending = tls.bio_read(65536)
                except SSL.WantReadError:
                    pending = b""
                if pending:
                    sock.sendall(pending)
                tls.bio_write(sock.recv(65536))
    t = threading.Thread(target=serve_bio)
    t.start()
    sock = socket.create_connection(listener.getsockname(), timeout=10)
    tls = SSL.Connection(client_ctx, None)
    tls.set_connect_state()
    pump(tls, sock, lambda: tls.do_handshake())
    tls.send(b"bio")
    sock.sendall(tls.bio_read(65536))
    print("memory bio", pump(tls, sock, lambda: tls.recv(100)).decode())
    t.join(20)
    sock.close()
"""


@pytest.mark.parametrize("kind", ["tcp", "rsock"])
def test_pyopenssl_on_a_socket(kind: str, tmp_path: Path, cert: tuple[str, str]) -> None:
    """pyOpenSSL's Connection on a socket does OpenSSL's I/O on its fd: over
    TCP it works; an rsock connection's fileno() is not the connection, so
    under the patch it is refused at once with EOPNOTSUPP (the client's
    handshake failed with EPIPE and the server's hung: pyftpdlib's FTPS).
    Its memory BIOs work on rsock sockets as on TCP's."""
    certfile, keyfile = cert
    code = _PYOPENSSL_ON_SOCKETS.format(certfile=certfile, keyfile=keyfile)
    out = run_as(kind, code, tmp_path, timeout=60)
    if kind == "tcp":
        assert out.split("\n") == ["client PING server ok", "memory bio BIO", ""], out
    else:
        assert out.split("\n") == [
            "client ENOTSUP server ENOTSUP",  # (errno.errorcode names EOPNOTSUPP so)
            "memory bio BIO",
            "",
        ], out
