"""Reliability against stdlib TCP as the oracle (issue 14): what an adversarial
probe found where rsock lost information or hung and TCP did not.

Every test runs on ``tcp`` and on ``rsock`` (``RSOCK_FALLBACK=never``, set by
conftest) and asserts what TCP does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from robust_peer import RobustPeer, RobustPeers
from support import assert_fast_path, provider_of


@pytest.fixture
def rpeers() -> Iterator[RobustPeers]:
    manager = RobustPeers()
    try:
        yield manager
    finally:
        manager.cleanup()


def tell(peer: RobustPeer, line: str) -> None:
    assert peer.proc.stdin is not None
    peer.proc.stdin.write(line.encode() + b"\n")
    peer.proc.stdin.flush()


def held_connection(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, peer_role: str, nbytes: int = 0
) -> tuple[Any, RobustPeer]:
    """A blocking connection (no timeout) to a ``hold-die`` peer that sent
    ``nbytes`` and reads nothing."""
    if peer_role == "server":
        peer = rpeers.start(transport, "hold-die", "server", 0, nbytes)
        port = int(peer.expect("PORT")[0])
        sock = sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM)
        sock.settimeout(20)
        sock.connect(("127.0.0.1", port))
    else:
        with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
            listener.settimeout(20)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            peer = rpeers.start(
                transport, "hold-die", "client", listener.getsockname()[1], nbytes
            )
            sock, _ = listener.accept()
    sock.settimeout(None)
    assert_fast_path(transport, sock)
    assert peer.expect("READY") == [provider_of(transport, sock)]
    peer.expect("SENT")
    return sock, peer


def reset_peer(peer: RobustPeer, how: str) -> None:
    """The peer ends as ``how`` says, with data of ours unread, and is gone."""
    tell(peer, how)
    peer.wait(10)


RECEIVERS: dict[str, Callable[[Any], object]] = {
    "recv": lambda s: s.recv(1024),
    "recv_into": lambda s: s.recv_into(bytearray(1024)),
    "recv_into_nbytes": lambda s: s.recv_into(bytearray(1024), 10),
    "recvmsg": lambda s: s.recvmsg(1024),
    "makefile_read": lambda s: s.makefile("rb").read(),
}
SENDERS: dict[str, Callable[[Any], object]] = {
    "send": lambda s: s.send(b"y" * 1000),
    "sendall": lambda s: s.sendall(b"y" * 1000),
    "sendall_1mib": lambda s: s.sendall(b"y" * (1 << 20)),
}


# --------------------------------------------------------------------------- 1. resets


@pytest.mark.timeout_s(30)
@pytest.mark.parametrize("how", ["kill", "_exit", "close"])
@pytest.mark.parametrize("api", sorted(RECEIVERS))
def test_reset_while_blocked_in_receive_raises(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, api: str, how: str
) -> None:
    """Blocked in a receive with no timeout when the peer resets (it dies or
    closes with our data unread): ConnectionResetError, never a clean EOF."""
    sock, peer = held_connection(sockmod, transport, rpeers, "client")
    with sock:
        sock.sendall(b"x" * 100)  # never read by the peer
        timer = threading.Timer(0.2, reset_peer, (peer, how))
        timer.start()
        try:
            with pytest.raises(ConnectionResetError):
                RECEIVERS[api](sock)
        finally:
            timer.join()


@pytest.mark.timeout_s(30)
@pytest.mark.parametrize("how", ["kill", "_exit", "close"])
@pytest.mark.parametrize("api", sorted(RECEIVERS) + sorted(SENDERS))
def test_reset_before_the_call_raises(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, api: str, how: str
) -> None:
    """The peer has reset before we call: the first receive or send raises
    ConnectionResetError (the reset is reported once: EOF after it)."""
    sock, peer = held_connection(sockmod, transport, rpeers, "server")
    with sock:
        sock.sendall(b"x" * 100)
        reset_peer(peer, how)
        time.sleep(0.05)  # TCP: the RST is in; rsock: the liveness channel hung up
        with pytest.raises(ConnectionResetError):
            (RECEIVERS.get(api) or SENDERS[api])(sock)
        assert sock.recv(10) == b""  # reported once, as TCP


@pytest.mark.timeout_s(30)
def test_reset_of_a_never_accepted_connection(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers
) -> None:
    """A client blocked in recv on a connection the listener's process never
    accepted, when that process is killed: ConnectionResetError."""
    peer = rpeers.start(transport, "listen-die")
    port = int(peer.expect("PORT")[0])
    with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(("127.0.0.1", port))
        sock.settimeout(None)
        timer = threading.Timer(0.3, reset_peer, (peer, "kill"))
        timer.start()
        try:
            with pytest.raises(ConnectionResetError):
                sock.recv(1024)
        finally:
            timer.join()


class _Lost(asyncio.Protocol):
    def __init__(self) -> None:
        self.got = bytearray()
        self.lost: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )

    def data_received(self, data: bytes) -> None:
        self.got += data

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


@pytest.mark.timeout_s(30)
@pytest.mark.parametrize("nbytes", [16 * 1024, 16 * 1024 + 1, 200 * 1024])
def test_asyncio_reset_after_data_is_reported(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, nbytes: int
) -> None:
    """The peer sent nbytes and was killed with our data unread: an asyncio
    Protocol gets the bytes, then connection_lost(ConnectionResetError).
    (16 KiB is exactly rsock's first read of a plain Protocol.)"""
    if transport == "rsock":
        import rsock.asyncio as aio_mod

        create_connection: Any = aio_mod.create_connection
    else:
        create_connection = None
    sock, peer = held_connection(sockmod, transport, rpeers, "server", nbytes)
    sock.sendall(b"x" * 100)
    reset_peer(peer, "kill")
    time.sleep(0.05)

    async def main() -> tuple[int, BaseException | None]:
        loop = asyncio.get_running_loop()
        if create_connection is not None:
            _, proto = await create_connection(_Lost, sock=sock)
        else:
            _, proto = await loop.create_connection(_Lost, sock=sock)
        exc = await asyncio.wait_for(proto.lost, 10)
        return len(proto.got), exc

    got, exc = asyncio.run(main())
    # TCP may drop what it had received when the RST comes; rsock keeps it
    assert got == nbytes if transport == "rsock" else got <= nbytes
    assert isinstance(exc, ConnectionResetError), repr(exc)


# --------------------------------------------------------------------------- 2. mass death


def accept_held(listener: Any, peer: RobustPeer, n: int) -> list[Any]:
    """Accepts the n connections of a ``hold-many`` peer, reads each index."""
    conns: list[Any] = []
    for _ in range(n):
        conn, _ = listener.accept()
        conns.append(conn)
        conn.settimeout(10)
        idx = b""
        while len(idx) < 4:
            chunk = conn.recv(4 - len(idx))
            assert chunk
            idx += chunk
        conn.setblocking(False)
    peer.expect("READY", timeout=60)
    return conns


class RoundTrips:
    """Select-driven 1-byte round trips over an unrelated connection, in a
    thread, recording the worst one (every wait goes through ``fileno()``)."""

    def __init__(self, sockmod: ModuleType) -> None:
        from support import connected_pair

        self.a, self.b = connected_pair(sockmod)
        self.worst = 0.0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _wait(self, sock: Any) -> None:
        import select

        p = select.poll()  # not select(): the fds may pass 1024
        p.register(sock, select.POLLIN)
        assert p.poll(30_000), "round trip: no data within 30 s"

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.a.sendall(b"p")
            self._wait(self.b)
            assert self.b.recv(1) == b"p"
            self.b.sendall(b"q")
            self._wait(self.a)
            assert self.a.recv(1) == b"q"
            self.worst = max(self.worst, time.monotonic() - t0)
            self.count += 1
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()
        self.a.close()
        self.b.close()


def death_of_many(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, n: int
) -> tuple[float, float, int]:
    """A child holding n connections to us is SIGKILLed while an unrelated
    connection does select-driven round trips.  Returns (seconds from the
    kill until the last connection ended, the worst round trip meanwhile,
    round trips made)."""
    import selectors

    from test_robust_scale import raise_fd_limit

    raise_fd_limit(4 * n + 1024)
    with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(min(n, 1024))
        listener.settimeout(30)
        peer = rpeers.start(transport, "hold-many", listener.getsockname()[1], n)
        conns = accept_held(listener, peer, n)
    assert_fast_path(transport, *conns)
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    probe = RoundTrips(sockmod)
    try:
        time.sleep(0.1)
        probe.worst = 0.0
        killed = time.monotonic()
        peer.kill()
        left = set(conns)
        while left:
            assert time.monotonic() - killed < 30, f"{len(left)} of {n} never ended"
            for key, _ in sel.select(1.0):
                c = key.fileobj
                try:
                    data = c.recv(1024)  # type: ignore[union-attr]
                except ConnectionResetError:
                    data = b""
                except BlockingIOError:
                    continue
                assert data == b""
                sel.unregister(c)
                left.discard(c)  # type: ignore[arg-type]
        ended = time.monotonic() - killed
        time.sleep(0.05)  # a round trip that is under way when the last ends
    finally:
        probe.stop()
        sel.close()
        for c in conns:
            c.close()
    return ended, probe.worst, probe.count


@pytest.mark.timeout_s(120)
def test_death_of_a_peer_with_100_connections(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers
) -> None:
    """All 100 ends are seen within 1 s of the kill, and an unrelated
    select-driven connection keeps its round trips short meanwhile."""
    ended, worst, count = death_of_many(sockmod, transport, rpeers, 100)
    print(f"\n{transport}: 100 ends in {ended * 1e3:.1f} ms, worst round trip "
          f"{worst * 1e3:.1f} ms of {count}")
    assert ended < 1.0
    assert worst < 0.25


@pytest.mark.timeout_s(120)
def test_death_of_a_peer_does_not_stall_an_event_loop(
    transport: str, rpeers: RobustPeers
) -> None:
    """An asyncio server holding 100 connections from a process that is
    killed: every connection_lost within 1 s, and the loop never stalls."""
    n = 100
    if transport == "rsock":
        import rsock.asyncio as aio_mod

        start_server: Any = aio_mod.create_server
    else:
        start_server = None

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        lost: list[float] = []
        made: list[int] = []

        class Held(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                made.append(1)

            def connection_lost(self, exc: BaseException | None) -> None:
                lost.append(time.monotonic())

        if start_server is not None:
            server = await start_server(Held, "127.0.0.1", 0, backlog=n)
        else:
            server = await loop.create_server(Held, "127.0.0.1", 0, backlog=n)
        port = server.sockets[0].getsockname()[1]
        peer = rpeers.start(transport, "hold-many", port, n)
        while len(made) < n:
            await asyncio.sleep(0.01)
        await loop.run_in_executor(None, peer.expect, "READY", 60.0)
        gaps = [0.0]

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.001)
                now = time.monotonic()
                gaps[0] = max(gaps[0], now - last)
                last = now

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.1)
        gaps[0] = 0.0
        killed = time.monotonic()
        peer.kill()
        while len(lost) < n and time.monotonic() - killed < 30:
            await asyncio.sleep(0.005)
        tick.cancel()
        server.close()
        assert len(lost) == n, f"{n - len(lost)} of {n} never lost"
        return max(lost) - killed, gaps[0]

    ended, gap = asyncio.run(main())
    print(f"\n{transport}: 100 connection_lost in {ended * 1e3:.1f} ms, loop gap "
          f"{gap * 1e3:.1f} ms")
    assert ended < 1.0
    assert gap < 0.25
