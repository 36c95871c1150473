"""TCP interop on the same port: an rsock listener serves plain TCP clients,
an rsock client reaching a plain TCP server falls back to TCP (unless
RSOCK_FALLBACK=never), and RSOCK_PROVIDER=tcp forces the TCP path.
``sock.provider`` says which path each connection took."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import recv_exact

import rsock


@pytest.fixture
def fallback_allowed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RSOCK_FALLBACK", raising=False)
    yield


def echo_once(conn: Any) -> None:
    with conn:
        data = recv_exact(conn, 5)
        conn.sendall(data.upper())


def test_plain_tcp_client_served_by_rsock_listener() -> None:
    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            srv.settimeout(10)
            conn, addr = srv.accept()
            assert conn.provider == "tcp"
            assert addr == c.getsockname()
            assert conn.getpeername() == c.getsockname()
            assert conn.getsockname() == c.getpeername()
            c.sendall(b"hello")
            echo_once(conn)
            assert recv_exact(c, 5) == b"HELLO"
        # the same listener still takes rsock clients on the fast path
        with rsock.create_connection(("127.0.0.1", port), timeout=10) as rc:
            conn, _ = srv.accept()
            assert rc.provider == "shm" and conn.provider == "shm"
            rc.sendall(b"again")
            echo_once(conn)
            assert recv_exact(rc, 5) == b"AGAIN"


def test_listener_fd_readable_for_plain_tcp_client() -> None:
    with rsock.socket() as srv, selectors.DefaultSelector() as sel:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        sel.register(srv, selectors.EVENT_READ)
        assert sel.select(0.05) == []
        with socket.create_connection(srv.getsockname(), timeout=10):
            assert sel.select(5.0)
            srv.setblocking(False)
            conn, _ = srv.accept()
            conn.close()


def test_curl_like_subprocess_client() -> None:
    """A client in another process that knows nothing of rsock."""
    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        code = (
            "import socket, sys\n"
            f"c = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n"
            "c.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
            "print(c.recv(100).decode())\n"
        )
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            srv.settimeout(10)
            conn, _ = srv.accept()
            with conn:
                assert conn.recv(100).startswith(b"GET / HTTP/1.0")
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
            out, _ = p.communicate(timeout=10)
            assert out.startswith("HTTP/1.0 200 OK")
        finally:
            p.kill()
            p.wait(10)


def test_rsock_client_falls_back_to_plain_tcp_server(fallback_allowed: None) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        t = threading.Thread(target=lambda: echo_once(srv.accept()[0]))
        t.start()
        try:
            with rsock.socket() as c:
                c.settimeout(10)
                c.connect(srv.getsockname())
                assert c.provider == "tcp"
                assert c.getpeername() == srv.getsockname()
                c.sendall(b"hello")
                assert recv_exact(c, 5) == b"HELLO"
                assert c.fileno() >= 0
        finally:
            t.join(10)


def test_no_fallback_when_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RSOCK_FALLBACK", "never")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with rsock.socket() as c:
            with pytest.raises(ConnectionRefusedError, match="RSOCK_FALLBACK=never"):
                c.connect(srv.getsockname())


def test_fallback_refused_like_tcp(fallback_allowed: None) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with rsock.socket() as c:
        with pytest.raises(ConnectionRefusedError):
            c.connect(("127.0.0.1", port))
        assert c.connect_ex(("127.0.0.1", port)) == 111


def test_nonblocking_fallback_connect(fallback_allowed: None) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with rsock.socket() as c:
            c.setblocking(False)
            err = c.connect_ex(srv.getsockname())
            assert err in (0, 115)  # EINPROGRESS
            with selectors.DefaultSelector() as sel:
                sel.register(c, selectors.EVENT_WRITE)
                assert sel.select(5.0)
            assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            assert c.provider == "tcp"
            conn, _ = srv.accept()
            conn.close()


def test_provider_tcp_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        monkeypatch.setenv("RSOCK_PROVIDER", "tcp")
        with rsock.socket() as c:
            c.settimeout(10)
            c.connect(srv.getsockname())
            assert c.provider == "tcp"
            srv.settimeout(10)
            conn, _ = srv.accept()
            assert conn.provider == "tcp"
            c.sendall(b"forcd")
            echo_once(conn)
            assert recv_exact(c, 5) == b"FORCD"
            # the TCP path has the kernel's full contract, detach() included
            dup = c.dup()
            assert dup.provider == "tcp"
            dup.close()
