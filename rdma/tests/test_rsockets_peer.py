"""rsock over verbs against a C peer that uses librdmacm's rsocket API.

Runs inside the rxe guest only (``make test-rdma``), with ``RSOCK_PROVIDER=verbs``
and ``RS_PEER`` naming the built ``rdma/rs_peer.c``.

rsock does not speak the rsockets wire protocol yet (native/PROTOCOL.md, section 8):
these tests pin down that the two refuse each other *cleanly* in both directions
(a clear error, no hang, the rsock listener keeps serving), and that rsock's own
protocol works across processes on the same device meanwhile.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading

import pytest

import rsock

PEER = os.environ.get("RS_PEER", "")
ADDR = os.environ.get("RSOCK_VERBS_ADDR", "10.77.0.1")

pytestmark = pytest.mark.timeout_s(120)


def _port() -> int:
    with rsock.socket() as s:  # a free port number (kernel TCP space)
        s.bind((ADDR, 0))
        return int(s.getsockname()[1])


def test_environment() -> None:
    assert os.environ.get("RSOCK_PROVIDER") == "verbs"
    assert PEER and os.access(PEER, os.X_OK), "RS_PEER must name the built rs_peer"
    n, why = rsock._socket.verbs_available()
    assert n > 0, why


def test_rsock_client_to_rsockets_server_is_refused_cleanly() -> None:
    port = _port()
    srv = subprocess.Popen([PEER, "server", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None
        assert srv.stdout.readline().startswith("listening")
        c = rsock.socket()
        c.settimeout(30)
        with pytest.raises(ConnectionRefusedError):
            c.connect((ADDR, port))
        c.close()
    finally:
        srv.kill()
        srv.wait(10)
        if srv.stdout is not None:
            srv.stdout.close()


def test_rsockets_client_to_rsock_server_is_refused_cleanly() -> None:
    lst = rsock.socket()
    lst.bind((ADDR, 0))
    lst.listen()
    port = lst.getsockname()[1]
    lst.settimeout(30)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = lst.accept()  # refuses the rsockets client, then takes ours
        with conn:
            got.append(conn.recv(100))

    t = threading.Thread(target=serve)
    t.start()
    try:
        out = subprocess.run(
            [PEER, "client", ADDR, str(port), "1000"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1
        assert out.stdout.startswith("error rconnect"), out.stdout
        # the listener still serves rsock clients
        with rsock.create_connection((ADDR, port), timeout=30) as c:
            assert c.provider == "verbs"
            c.sendall(b"still serving")
        t.join(30)
        assert got == [b"still serving"]
    finally:
        lst.close()


def test_two_processes_over_verbs() -> None:
    """rsock <-> rsock across processes on the device: 8 MiB, SHA-256 checked."""
    lst = rsock.socket()
    lst.bind((ADDR, 0))
    lst.listen()
    port = lst.getsockname()[1]
    code = (
        "import hashlib, rsock, sys\n"
        f"c = rsock.create_connection(({ADDR!r}, {port}), timeout=60)\n"
        "assert c.provider == 'verbs', c.provider\n"
        "data = bytes(range(256)) * (8 << 12)\n"
        "c.sendall(data); c.shutdown(rsock.SHUT_WR)\n"
        "assert c.recv(64) == hashlib.sha256(data).hexdigest().encode()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        lst.settimeout(60)
        conn, _ = lst.accept()
        conn.settimeout(60)
        h = hashlib.sha256()
        n = 0
        while b := conn.recv(1 << 20):
            h.update(b)
            n += len(b)
        conn.sendall(h.hexdigest().encode())
        conn.close()
        assert child.wait(60) == 0
        assert n == 8 << 20
    finally:
        child.kill()
        lst.close()
