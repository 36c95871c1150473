"""Peer death: a peer process is SIGKILLed and the survivor must notice quickly,
keep what had already arrived, and leak nothing (fds, rsock mappings, threads).

Extends ``test_socket_behaviour.py`` (blocked ``recv``/``sendall``: detection
time) and ``test_asyncio.py`` (``connection_lost`` of a client): here the
survivor also holds data in flight, the peer dies before ``accept()``, the
asyncio side is a server or a paused writer, and every test counts the
survivor's fds, ``memfd:rsock`` mappings and threads before and after.

Oracle: when a TCP peer process dies its kernel closes the socket, so the
survivor reads what had arrived and then EOF (or ECONNRESET when the dead
peer had unread data).  An rsock peer that is killed sends nothing, but on
shm it published what its application had consumed: the survivor reads all
the data, then EOF when nothing of its own was left unread, as over TCP, else
``ConnectionResetError`` (where TCP may also drop what had arrived).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import time
from collections.abc import Callable, Coroutine
from types import ModuleType, SimpleNamespace
from typing import Any, TypeVar

import pytest
from robust_peer import RobustPeer, RobustPeers, Snapshot, assert_no_leaks, pattern, sha256
from support import MiB, Peers, assert_fast_path, provider_of
from test_socket_behaviour import connect_to_holding_peer, kill_later

T = TypeVar("T")

# The survivor must learn of the death within this long after the kill (plus the
# margin for the kernel to deliver SIGKILL and tear the process down).
DETECT_LIMIT_S = 1.0
KILL_DELIVERY_MARGIN_S = 0.25


def kill_now(peer: RobustPeer) -> float:
    killed_at = time.monotonic()
    os.kill(peer.pid, signal.SIGKILL)
    peer.proc.wait(10)
    return killed_at


def read_to_end(sock: Any) -> tuple[bytes, str]:
    """Everything until EOF (``"eof"``) or ``ConnectionResetError`` (``"reset"``)."""
    chunks = []
    while True:
        try:
            data = sock.recv(1 << 16)
        except ConnectionResetError:
            return b"".join(chunks), "reset"
        if not data:
            return b"".join(chunks), "eof"
        chunks.append(data)


def connect_to_sending_peer(
    sockmod: ModuleType,
    transport: str,
    rpeers: RobustPeers,
    peer_role: str,
    nbytes: int,
    seed: int,
) -> tuple[Any, RobustPeer]:
    """A connection to a peer that sends ``nbytes`` seeded bytes and then holds,
    reading nothing, until killed."""
    if peer_role == "server":
        peer = rpeers.start(transport, "send-hold", "server", 0, nbytes, seed)
        port = int(peer.expect("PORT")[0])
        sock = sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM)
        try:
            sock.settimeout(20)
            sock.connect(("127.0.0.1", port))
        except BaseException:
            sock.close()
            raise
    else:
        with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
            listener.settimeout(20)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            peer = rpeers.start(
                transport, "send-hold", "client", listener.getsockname()[1], nbytes, seed
            )
            sock, _ = listener.accept()
    try:
        assert_fast_path(transport, sock)
        assert peer.expect("READY") == [provider_of(transport, sock)]
    except BaseException:
        sock.close()
        raise
    return sock, peer


# --------------------------------------------------------------------------- sync


@pytest.mark.parametrize("peer_role", ["server", "client"])
@pytest.mark.parametrize("unread", [False, True], ids=["peer-read-all", "peer-had-unread"])
def test_peer_sigkill_with_data_in_flight(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, peer_role: str, unread: bool
) -> None:
    """The peer sent 1 MiB that we have not read yet, then died: we read all of it
    (checksummed), then EOF or ECONNRESET, quickly; nothing leaks."""
    nbytes, seed = MiB + 12345, 11
    before = Snapshot()
    sock, peer = connect_to_sending_peer(sockmod, transport, rpeers, peer_role, nbytes, seed)
    with sock:
        sock.settimeout(15)
        if unread:
            sock.sendall(b"never read by the peer" * 100)
        assert peer.expect("SENT") == [sha256(pattern(seed, nbytes))]
        killed_at = kill_now(peer)
        data, end = read_to_end(sock)
        elapsed = time.monotonic() - killed_at
        stats = sock.stats() if transport == "rsock" else None
    peer.cleanup()
    assert elapsed < DETECT_LIMIT_S + KILL_DELIVERY_MARGIN_S, f"end seen after {elapsed:.3f} s"
    expected = pattern(seed, nbytes)
    if transport == "tcp" and unread:
        # TCP resets and may drop what was still in the dead peer's send queue
        assert expected.startswith(data)
    else:
        assert len(data) == nbytes and sha256(data) == sha256(expected), (len(data), nbytes)
    # the dead peer's end: a FIN if it had read all we sent, else a reset
    assert end == ("reset" if unread else "eof")
    if transport == "rsock":
        assert stats is not None and stats["rx_bytes"] == nbytes
    assert_no_leaks(before)


@pytest.mark.parametrize("how", ["exit", "_exit"])
def test_peer_exits_without_closing(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, how: str
) -> None:
    """The peer sends and exits without closing its socket.  A normal interpreter exit
    closes it; after os._exit (like a crash, or a multiprocessing child's end) a TCP
    peer's kernel still sends FIN, and an rsock peer's published count says it had
    nothing unread: EOF after all the data on both."""
    nbytes, seed = 300_000, 16
    before = Snapshot()
    with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
        listener.settimeout(20)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        peer = rpeers.start(transport, "send-exit", "client", port, nbytes, seed, how)
        conn, _ = listener.accept()
    with conn:
        peer.expect("READY")
        conn.settimeout(15)
        data, end = read_to_end(conn)
    assert peer.wait() == 0
    peer.cleanup()
    assert data == pattern(seed, nbytes)
    assert end == "eof"
    assert_no_leaks(before)


def test_peer_sigkill_before_accept(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers
) -> None:
    """A client connects, sends and is killed before we accept it: accept() still
    gives the connection, with all its data, then the end; nothing leaks."""
    nbytes, seed = 200_000, 12
    before = Snapshot()
    with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
        listener.settimeout(20)
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        peer = rpeers.start(
            transport, "send-hold", "client", listener.getsockname()[1], nbytes, seed
        )
        peer.expect("READY")
        peer.expect("SENT")
        kill_now(peer)
        conn, _ = listener.accept()
        with conn:
            assert_fast_path(transport, conn)
            conn.settimeout(15)
            data, end = read_to_end(conn)
    peer.cleanup()
    assert data == pattern(seed, nbytes)
    assert end == "eof"
    assert_no_leaks(before)


def test_peer_sigkill_before_accept_then_listener_closed(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers
) -> None:
    """Dead clients that were never accepted cost nothing once the listener closes."""
    before = Snapshot()
    with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        clients = [rpeers.start(transport, "send-hold", "client", port, 1000, i) for i in range(3)]
        for peer in clients:
            peer.expect("READY")
            peer.expect("SENT")
        for peer in clients:
            kill_now(peer)
    rpeers.cleanup()
    assert_no_leaks(before)


@pytest.mark.parametrize("blocked_in", ["recv", "sendall"])
@pytest.mark.parametrize("peer_role", ["server", "client"])
def test_peer_sigkill_while_blocked_leaks_nothing(
    sockmod: ModuleType, transport: str, peers: Peers, peer_role: str, blocked_in: str
) -> None:
    """test_socket_behaviour's blocked recv/sendall, with fds, mappings and threads
    counted before and after."""
    before = Snapshot()
    sock, peer = connect_to_holding_peer(sockmod, transport, peers, peer_role)
    with sock:
        sock.settimeout(15)
        if blocked_in == "recv":
            killer = kill_later(peer, delay=0.2)
            assert sock.recv(1024) == b""  # (we sent nothing it could leave unread)
        else:
            killer = kill_later(peer, delay=0.6)  # long enough for the rings to fill
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                while True:
                    sock.sendall(b"\x5a" * MiB)
        detected_at = time.monotonic()
        killed_at = killer.result()
    peer.cleanup()
    assert 0 < detected_at - killed_at < DETECT_LIMIT_S + KILL_DELIVERY_MARGIN_S
    assert_no_leaks(before)


def test_idle_survivor_fd_readable_within_a_second_then_data(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers
) -> None:
    """An idle survivor that already read everything: its fd turns readable within
    a second of the kill (it stays level-triggered), and recv gives the end."""
    sock, peer = connect_to_sending_peer(sockmod, transport, rpeers, "server", 100, 13)
    with sock:
        peer.expect("SENT")
        sock.settimeout(10)
        got = b""
        while len(got) < 100:
            got += sock.recv(100 - len(got))
        assert got == pattern(13, 100)
        r, _, _ = select.select([sock], [], [], 0.1)
        assert not r
        killed_at = kill_now(peer)
        r, _, _ = select.select([sock], [], [], 5)
        elapsed = time.monotonic() - killed_at
        assert r and elapsed < DETECT_LIMIT_S + KILL_DELIVERY_MARGIN_S, elapsed
        for _ in range(3):  # level-triggered: still readable
            r, _, _ = select.select([sock], [], [], 0)
            assert r
        assert read_to_end(sock) == (b"", "eof")


# --------------------------------------------------------------------------- asyncio


LOOPS = ["asyncio", "uvloop"]


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    def runner(coro: Coroutine[Any, Any, T]) -> T:
        if request.param == "uvloop":
            import uvloop

            return uvloop.run(coro)  # type: ignore[no-any-return]
        return asyncio.run(coro)

    return runner


@pytest.fixture
def aio(transport: str) -> SimpleNamespace:
    if transport == "rsock":
        import rsock.asyncio as ra

        return SimpleNamespace(
            create_server=ra.create_server, create_connection=ra.create_connection
        )

    async def create_server(factory: Any, *a: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().create_server(factory, *a, **kw)

    async def create_connection(factory: Any, *a: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().create_connection(factory, *a, **kw)

    return SimpleNamespace(create_server=create_server, create_connection=create_connection)


async def aexpect(peer: RobustPeer, word: str, timeout: float = 30.0) -> list[str]:
    """``peer.expect`` without blocking the loop (nor starting an executor thread)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return peer.expect(word, timeout=0.001)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.005)


async def warm_up(aio: SimpleNamespace) -> None:
    """One connection through the loop first: uvloop creates some fds and its
    thread pool lazily, and keeps them for the life of the process."""
    server = await aio.create_server(Collect, "127.0.0.1", 0)
    tr, cp = await aio.create_connection(Collect, "127.0.0.1", server.sockets[0].getsockname()[1])
    tr.close()
    await cp.lost
    server.close()
    await server.wait_closed()


class Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.paused = 0
        self.lost: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.lost_at = 0.0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data

    def pause_writing(self) -> None:
        self.paused += 1

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.lost.done():
            self.lost_at = time.monotonic()
            self.lost.set_result(exc)


def test_asyncio_server_peer_killed_with_data_in_flight(
    aio: SimpleNamespace, transport: str, run: Any, rpeers: RobustPeers
) -> None:
    """An asyncio server's client sends 256 KiB and dies: the protocol gets every
    byte, then connection_lost within a second; the server side leaks nothing."""
    nbytes, seed = 256 * 1024 + 7, 14

    async def main() -> None:
        protos: list[Collect] = []

        def factory() -> Collect:
            protos.append(Collect())
            return protos[-1]

        await warm_up(aio)
        before = Snapshot()
        server = await aio.create_server(factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        peer = rpeers.start(transport, "send-hold", "client", port, nbytes, seed)
        await aexpect(peer, "READY")
        await aexpect(peer, "SENT")
        deadline = time.monotonic() + 10
        while (not protos or len(protos[0].data) < nbytes) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert protos and protos[0].data == pattern(seed, nbytes)
        killed_at = kill_now(peer)
        exc = await asyncio.wait_for(protos[0].lost, 5)
        elapsed = protos[0].lost_at - killed_at
        assert exc is None, exc  # it had read everything we sent (nothing): EOF
        assert elapsed < DETECT_LIMIT_S + KILL_DELIVERY_MARGIN_S, elapsed
        server.close()
        await server.wait_closed()
        peer.cleanup()
        await asyncio.sleep(0)
        assert_no_leaks(before)

    run(asyncio.wait_for(main(), 30))


def test_asyncio_paused_writer_peer_killed(
    aio: SimpleNamespace, transport: str, run: Any, rpeers: RobustPeers
) -> None:
    """A client writes to a peer that reads nothing until pause_writing; the peer is
    killed: connection_lost within a second, with an error; nothing leaks."""

    async def main() -> None:
        await warm_up(aio)
        before = Snapshot()
        peer = rpeers.start(transport, "send-hold", "server", 0, 0, 15)
        port = int((await aexpect(peer, "PORT"))[0])
        tr, cp = await aio.create_connection(Collect, "127.0.0.1", port)
        await aexpect(peer, "READY")
        await aexpect(peer, "SENT")
        block = b"w" * MiB
        for _ in range(512):
            if cp.paused:
                break
            tr.write(block)
            await asyncio.sleep(0.001)
        assert cp.paused, "pause_writing never called although the peer reads nothing"
        await asyncio.sleep(0.1)
        killed_at = kill_now(peer)
        exc = await asyncio.wait_for(cp.lost, 5)
        elapsed = cp.lost_at - killed_at
        assert isinstance(exc, (ConnectionResetError, BrokenPipeError)), exc
        assert elapsed < DETECT_LIMIT_S + KILL_DELIVERY_MARGIN_S, elapsed
        assert tr.is_closing()
        peer.cleanup()
        await asyncio.sleep(0)
        assert_no_leaks(before)

    run(asyncio.wait_for(main(), 30))
