"""rsock over verbs against a C peer that uses librdmacm's rsocket API.

Runs inside the rxe guest only (``make test-rdma``), with ``RSOCK_PROVIDER=verbs``
and ``RS_PEER`` naming the built ``rdma/rs_peer.c``.

rsock speaks rsockets' stream protocol to rsockets peers (native/PROTOCOL.md,
section 9): an rsock client falls back to it when an rsockets listener refuses rsock's
own connection data, and an rsock listener answers rsockets clients in it.  Both
directions are checked with byte counts and checksums computed on the other side.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import threading
from typing import Any

import pytest

import rsock
from rsock import _paths

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
    n, why = _paths.verbs_available()
    assert n > 0, why


def _fnv(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _pattern(n: int) -> bytes:
    return bytes((i * 131) & 0xFF for i in range(n))


# A small volume: the FNV checksum runs in Python under emulation.
TOTAL = 300_000


def _first_difference(got: bytes, want: bytes) -> str:
    """Where a received stream departs from the sent one (for the failure message)."""
    n = min(len(got), len(want))
    i = next((k for k in range(n) if got[k] != want[k]), n)
    if i == n and len(got) == len(want):
        return "identical"
    j = i
    while j < n and got[j] != want[j]:
        j += 1
    return (
        f"first difference at byte {i} of {len(want)} (received {len(got)}), "
        f"{j - i} bytes differ from there; got {got[i : i + 16].hex()} "
        f"want {want[i : i + 16].hex()}"
    )


def test_rsock_client_to_rsockets_server(tmp_path: Any) -> None:
    """rsock speaks rsockets' protocol to a librdmacm rsocket server (after it refuses
    rsock's own connection data): bytes and checksum verified by the C peer (which
    also keeps what it received, to say where a corrupted stream differs)."""
    port = _port()
    dump = tmp_path / "received"
    srv = subprocess.Popen(
        [PEER, "server", str(port), str(dump)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert srv.stdout is not None
        assert srv.stdout.readline().startswith("listening")
        data = _pattern(TOTAL)
        with rsock.create_connection((ADDR, port), timeout=60) as c:
            assert c.provider == "verbs"
            for i in range(0, TOTAL, 7001):  # uneven writes
                c.sendall(data[i : i + 7001])
            c.shutdown(rsock.SHUT_WR)
            answer = b""
            while len(answer) < 16 and (b := c.recv(16 - len(answer))):
                answer += b
            assert c.recv(1) == b""  # the server closes
        total, checksum = struct.unpack("<QQ", answer)
        assert srv.wait(30) == 0
        got = dump.read_bytes()
        assert total == TOTAL and checksum == _fnv(data), (
            f"{_first_difference(got, data)}; answer {answer.hex()}"
        )
        assert srv.wait(30) == 0
        assert srv.stdout.readline().startswith(f"ok {TOTAL} bytes")
    finally:
        srv.kill()
        srv.wait(10)
        if srv.stdout is not None:
            srv.stdout.close()


def test_rsockets_client_to_rsock_server() -> None:
    """A librdmacm rsocket client against an rsock listener: rsock answers in rsockets'
    protocol; the C client checks the count and checksum rsock computed."""
    lst = rsock.socket()
    lst.bind((ADDR, 0))
    lst.listen()
    port = lst.getsockname()[1]
    lst.settimeout(60)
    result: list[Any] = []

    def serve() -> None:
        try:
            conn, _ = lst.accept()
            with conn:
                conn.settimeout(60)
                got = bytearray()
                while b := conn.recv(65536):
                    got += b
                conn.sendall(struct.pack("<QQ", len(got), _fnv(bytes(got))))
                result.append((conn.provider, len(got), bytes(got) == _pattern(len(got))))
        except Exception as e:  # reported by the assertion below
            result.append(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        out = subprocess.run(
            [PEER, "client", ADDR, str(port), str(TOTAL)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        t.join(60)
        assert result == [("verbs", TOTAL, True)], (result, out.stdout, out.stderr)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("ok sent"), out.stdout
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
