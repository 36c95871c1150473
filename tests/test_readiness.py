"""``fileno()`` readiness: select, poll, epoll and selectors see what the
socket has, level-triggered, on both transports (stdlib TCP is the oracle).

Readability is checked for data, EOF, a vanished peer and a pending
connection; a socket whose data was consumed stops being readable.
"""

from __future__ import annotations

import select
import selectors
import socket
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from support import Peers, connected_pair, recv_exact

Pair = tuple[Any, Any]
Readable = Callable[[Any, float], bool]


def readable_select(sock: Any, timeout: float) -> bool:
    r, _, _ = select.select([sock], [], [], timeout)
    return bool(r)


def readable_poll(sock: Any, timeout: float) -> bool:
    p = select.poll()
    p.register(sock.fileno(), select.POLLIN)
    return bool(p.poll(timeout * 1000))


def readable_epoll(sock: Any, timeout: float) -> bool:
    with select.epoll() as ep:
        ep.register(sock.fileno(), select.EPOLLIN)
        return bool(ep.poll(timeout))


def readable_selector(sock: Any, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        return bool(sel.select(timeout))


CHECKS: dict[str, Callable[[Any, float], bool]] = {
    "select": readable_select,
    "poll": readable_poll,
    "epoll": readable_epoll,
    "selectors": readable_selector,
}


@pytest.fixture(params=sorted(CHECKS))
def readable(request: pytest.FixtureRequest) -> Callable[[Any, float], bool]:
    return CHECKS[request.param]


def test_fileno_is_a_real_fd(pair: Pair) -> None:
    client, server = pair
    assert client.fileno() >= 0 and server.fileno() >= 0
    assert client.fileno() != server.fileno()
    # stable for the life of the socket
    assert client.fileno() == client.fileno()


def test_readable_on_data_level_triggered(pair: Pair, readable: Readable) -> None:
    client, server = pair
    assert not readable(server, 0.05)
    client.sendall(b"0123456789")
    assert readable(server, 5.0)
    # level-triggered: still readable until everything is consumed
    assert recv_exact(server, 4) == b"0123"
    assert readable(server, 0)
    assert recv_exact(server, 6) == b"456789"
    assert not readable(server, 0.05)


def test_readable_on_data_arriving_while_waiting(
    pair: Pair, readable: Readable
) -> None:
    client, server = pair
    assert not readable(server, 0)
    import threading

    t = threading.Timer(0.1, client.sendall, args=(b"late",))
    t.start()
    try:
        t0 = time.monotonic()
        assert readable(server, 5.0)
        assert time.monotonic() - t0 < 4.0
        assert server.recv(16) == b"late"
    finally:
        t.join()


def test_readable_on_eof(pair: Pair, readable: Readable) -> None:
    client, server = pair
    server.fileno()  # the fd is handed out before the event, as a selector would
    client.shutdown(socket.SHUT_WR)
    assert readable(server, 5.0)
    assert server.recv(16) == b""
    # EOF stays readable
    assert readable(server, 0)


def test_readable_on_pending_connection(
    sockmod: ModuleType, readable: Readable
) -> None:
    with sockmod.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        assert not readable(listener, 0.05)
        with sockmod.socket() as client:
            client.settimeout(10)
            client.connect(listener.getsockname())
            assert readable(listener, 5.0)
            conn, _ = listener.accept()
            conn.close()
        assert not readable(listener, 0.05)


def test_readable_when_peer_killed(
    sockmod: ModuleType, transport: str, peers: Peers, readable: Readable
) -> None:
    from test_socket_behaviour import connect_to_holding_peer

    sock, peer = connect_to_holding_peer(sockmod, transport, peers, "server")
    with sock:
        assert not readable(sock, 0.05)
        peer.kill()
        t0 = time.monotonic()
        assert readable(sock, 5.0)
        assert time.monotonic() - t0 < 1.5
        sock.setblocking(False)
        try:
            assert sock.recv(16) == b""
        except ConnectionResetError:
            pass


def test_nonblocking_recv_after_select(pair: Pair) -> None:
    """The select-then-recv loop of a non-blocking server moves every byte."""
    client, server = pair
    server.setblocking(False)
    payload = bytes(range(256)) * 4096  # 1 MiB
    import threading

    sender = threading.Thread(target=client.sendall, args=(payload,))
    sender.start()
    got = bytearray()
    deadline = time.monotonic() + 30
    try:
        while len(got) < len(payload) and time.monotonic() < deadline:
            r, _, _ = select.select([server], [], [], 1.0)
            if not r:
                continue
            try:
                chunk = server.recv(65536)
            except BlockingIOError:
                continue
            assert chunk, "unexpected EOF"
            got += chunk
    finally:
        sender.join(30)
    assert bytes(got) == payload


def test_many_sockets_in_one_selector(sockmod: ModuleType, transport: str) -> None:
    pairs = [connected_pair(sockmod) for _ in range(8)]
    try:
        with selectors.DefaultSelector() as sel:
            for i, (_, server) in enumerate(pairs):
                sel.register(server, selectors.EVENT_READ, i)
            for i in (1, 5, 6):
                pairs[i][0].sendall(b"x%d" % i)
            seen: set[int] = set()
            deadline = time.monotonic() + 5
            while len(seen) < 3 and time.monotonic() < deadline:
                for key, _ in sel.select(1.0):
                    seen.add(key.data)
                    assert pairs[key.data][1].recv(16) == b"x%d" % key.data
            assert seen == {1, 5, 6}
            assert sel.select(0.05) == []
    finally:
        for c, s in pairs:
            c.close()
            s.close()
