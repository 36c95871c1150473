"""Sockets handed to child processes by multiprocessing (spawn, forkserver,
fork), as uvicorn --workers and the stdlib's documentation do: a listening
or a bound socket pickled into a child, which listens and accepts from the
same queue as its parent and its siblings.  Each test runs on stdlib TCP
(the oracle) and on rsock; over rsock every connection must be on shm."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import time
from types import ModuleType
from typing import Any

import pytest
from support import assert_fast_path, connected_pair

METHODS = ["spawn", "forkserver", "fork"]


def _serve(sock: Any, rounds: int, results: Any) -> None:
    """Child: listen if the parent only bound, then echo `rounds` clients
    (upper-cased), reporting what each sent."""
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.listen()
    for _ in range(rounds):
        conn, _addr = sock.accept()
        with conn:
            data = conn.recv(100)
            conn.sendall(data.upper())
            results.put(data)
    sock.close()


def _client(sockmod: ModuleType, transport: str, port: int, payload: bytes) -> bytes:
    with sockmod.create_connection(("127.0.0.1", port), timeout=30) as c:
        if transport == "rsock":
            assert c.provider == "shm"
        c.sendall(payload)
        return bytes(c.recv(100))


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound"])
@pytest.mark.parametrize("method", METHODS)
def test_socket_handed_to_children(
    sockmod: ModuleType, transport: str, method: str, listening: bool
) -> None:
    """Two children get the same socket (listening, or bound only: each
    calls listen()) and serve clients from the one queue; the parent keeps
    its copy open and closes it last."""
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    with sockmod.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        if listening:
            srv.listen()
        port = srv.getsockname()[1]
        children = [ctx.Process(target=_serve, args=(srv, 3, results)) for _ in range(2)]
        for p in children:
            p.start()
        try:
            payloads = [b"client %d" % i for i in range(6)]
            if not listening:
                # a bound socket nobody listens on yet refuses, as TCP's does:
                # wait until a child listens
                replies = []
                for payload in payloads:
                    for _ in range(300):
                        try:
                            replies.append(_client(sockmod, transport, port, payload))
                            break
                        except ConnectionRefusedError:
                            time.sleep(0.05)
            else:
                replies = [_client(sockmod, transport, port, p) for p in payloads]
            assert replies == [p.upper() for p in payloads]
            assert sorted(results.get(timeout=20) for _ in payloads) == sorted(payloads)
        finally:
            for p in children:
                p.join(20)
                if p.is_alive():
                    p.kill()
                    p.join()
        assert [p.exitcode for p in children] == [0, 0]


def test_plain_pickle_of_a_socket_is_refused(sockmod: ModuleType) -> None:
    """pickle (not multiprocessing's pickler) refuses sockets, as the stdlib."""
    with sockmod.socket() as s:
        with pytest.raises(TypeError, match="cannot pickle"):
            pickle.dumps(s)


def test_a_connected_socket_cannot_go_to_a_child() -> None:
    """An rsock connection lives in its process's engine: multiprocessing's
    pickler refuses it with a clear TypeError, and the connection still
    works.  (The stdlib hands a connected kernel socket over: a listed
    difference, so this test is rsock's only.)"""
    from multiprocessing.reduction import ForkingPickler

    import rsock

    client, server = connected_pair(rsock)
    try:
        assert_fast_path("rsock", client, server)
        with pytest.raises(TypeError, match="connected rsock.socket"):
            ForkingPickler.dumps(client)
        client.sendall(b"still here")
        assert server.recv(10) == b"still here"
    finally:
        client.close()
        server.close()


