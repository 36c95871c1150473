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
