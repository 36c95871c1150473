"""rsock._fastcall, the per-message entry points: bad arguments get clear
errors (never a call into the engine), and the buffer kinds the stdlib takes
work through it (checked against what arrives)."""

from __future__ import annotations

import array
import gc
import hashlib

import pytest
from support import connected_pair

import rsock
from rsock import _fastcall, _lowlevel


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        _fastcall.send(0, b"x")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _fastcall.recv_into("0", bytearray(1), 0)
    with pytest.raises(OverflowError):
        _fastcall.send(0, b"x", 1 << 40)
    with pytest.raises(OverflowError):
        _fastcall.recv_into(0, bytearray(1), -2)
    with pytest.raises(BufferError):
        _fastcall.recv_into(0, b"read-only", 0)
    with pytest.raises(TypeError):
        _fastcall.sendall(0, "text", 0)
    with pytest.raises(ValueError):
        _fastcall.bind(0, 0)
    with pytest.raises(TypeError):
        _fastcall.bind(1, 2, 3)
    with pytest.raises(TypeError):
        _fastcall.Owner("0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _fastcall.Owner(sock_addr=1)  # type: ignore[call-arg]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="nbytes > 0"):
            _fastcall.recv_bytes(0, bad, 0)
    with pytest.raises(TypeError):
        _fastcall.recv_bytes(0, "1", 0)
    with pytest.raises(OverflowError):
        _fastcall.recv_bytes(0, 1 << 70, 0)
    with pytest.raises(OverflowError):
        _fastcall.recv_bytes(0, 1, 1 << 40)
    with pytest.raises(TypeError):
        _fastcall.recv_bytes(0, 1)  # type: ignore[call-arg]
    for args in ((), (0,), (0, 0, 0)):
        with pytest.raises(TypeError, match="accept expects 2 arguments"):
            _fastcall.accept(*args)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _fastcall.accept("0", 0)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        _fastcall.accept(0, 1 << 40)


def test_accept_gives_the_announced_addresses() -> None:
    """accept (rsock.socket's): -EAGAIN while nobody waits, then the new
    connection's handle and the addresses its client announced, as the
    socket module shows them (IPv4 and IPv6)."""
    import errno

    for family, host in ((rsock.AF_INET, "127.0.0.1"), (rsock.AF_INET6, "::1")):
        with rsock.socket(family) as listener:
            listener.bind((host, 0))
            listener.listen()
            assert listener._h is not None
            assert _fastcall.accept(listener._h.addr, 0) == -errno.EAGAIN
            with rsock.socket(family) as client:
                client.connect(listener.getsockname())
                r = _fastcall.accept(listener._h.addr, 10_000)
                assert isinstance(r, tuple), r
                rc, addr, peer, local, provider = r
                assert rc >= 0 and addr
                accepted = _lowlevel.Handle(_lowlevel.ffi.cast("rsk_sock *", addr))
                assert provider == "shm", provider  # (rsk_provider's name for it)
                assert _lowlevel.close(accepted) == 0
                assert peer == client.getsockname(), (peer, client.getsockname())
                assert local is not None and local[:2] == listener.getsockname()[:2], local


def test_recv_bytes_takes_what_is_readable() -> None:
    """recv_bytes (rsock.asyncio's plain-Protocol read): -EAGAIN while
    nothing is there, at most nbytes of what is, in order, whole across
    the ring's wrap (checked by digest), then b"" at EOF."""
    import errno

    client, server = connected_pair(rsock)
    with client, server:
        assert server._h is not None
        addr = server._h.addr
        assert _fastcall.recv_bytes(addr, 100, 0) == -errno.EAGAIN
        client.sendall(b"hello world")
        assert _fastcall.recv_bytes(addr, 5, 0) == b"hello"
        assert _fastcall.recv_bytes(addr, 100, 0) == b" world"
        assert _fastcall.recv_bytes(addr, 100, 0) == -errno.EAGAIN
        # more than a ring: chunks never above nbytes, bytes all there
        sent = hashlib.sha256()
        got = hashlib.sha256()
        total = 0
        block = bytes(range(256)) * 1000
        for _ in range(40):  # 10 MiB through an 8 MiB ring, interleaved
            client.sendall(block)
            sent.update(block)
            while True:
                r = _fastcall.recv_bytes(addr, 65536, 0)
                if isinstance(r, int):
                    assert r == -errno.EAGAIN
                    break
                assert 0 < len(r) <= 65536
                got.update(r)
                total += len(r)
        assert total == 40 * len(block) and got.digest() == sent.digest()
        client.close()
        assert _fastcall.recv_bytes(addr, 100, 1000) == b""


def test_buffer_kinds_through_the_hot_paths() -> None:
    client, server = connected_pair(rsock)
    with client, server:
        assert client._h is not None and client._h.addr
        arr = array.array("i", range(1000))  # 4000 bytes, itemsize 4
        payloads = [b"bytes", bytearray(b"bytearray"), memoryview(b"0123456789")[2:7], arr]
        expect = b"".join(bytes(p) for p in payloads)
        for p in payloads:
            client.sendall(p)
        assert client.send(memoryview(bytearray(b"send"))) == 4
        expect += b"send"
        got = bytearray()
        while len(got) < len(expect):
            buf = bytearray(777)
            n = server.recv_into(buf)
            assert n > 0
            got += buf[:n]
        assert hashlib.sha256(got).digest() == hashlib.sha256(expect).digest()
        # a strided view is not contiguous: refused as by the stdlib (checked
        # against socket.socketpair), nothing sent
        for fn in (client.sendall, client.send):
            with pytest.raises(BufferError, match="not C-contiguous"):
                fn(memoryview(b"abcdef")[::2])
    assert _lowlevel.fast_send is _fastcall.send


@pytest.mark.parametrize("mod", ["tcp", "rsock"])
def test_recv_into_nbytes(mod: str) -> None:
    """recv_into's nbytes through the hot path: a prefix of the buffer is
    filled and nothing past it; bad values get the stdlib's errors (TCP is
    the oracle) and lose no data."""
    import socket

    client, server = connected_pair(rsock if mod == "rsock" else socket)
    with client, server:
        client.settimeout(10)
        server.settimeout(None)  # blocking: the hot path
        client.sendall(bytes(range(256)) * 40)  # 10240 bytes
        buf = bytearray(b"\xee" * 100)
        got = bytearray()
        n = server.recv_into(buf, 7)
        assert 1 <= n <= 7 and buf[n:] == b"\xee" * (100 - n)
        got += buf[:n]
        errors = []
        for bad in (101, -1, 1 << 70, -(1 << 70), "3", 2.0):
            with pytest.raises((ValueError, OverflowError, TypeError)) as ei:
                server.recv_into(buf, bad)  # type: ignore[arg-type]
            errors.append((type(ei.value), str(ei.value)))
        assert errors[0] == (ValueError, "buffer too small for requested bytes")
        assert errors[1] == (ValueError, "negative buffersize in recv_into")
        assert errors[2][0] is OverflowError and errors[3][0] is OverflowError
        assert errors[4][0] is TypeError and errors[5][0] is TypeError
        while len(got) < 10240:
            n = server.recv_into(buf, 100 if len(got) % 2 else 0)
            assert n > 0
            got += buf[:n]
        assert got == bytes(range(256)) * 40


def test_the_engine_handle_is_freed_outside_the_collectors_finalizers() -> None:
    """An rsock connection's engine object is freed by ``_fastcall.Owner``,
    which the garbage collector neither tracks nor finalizes: in a reference
    cycle the collector runs every finalizer first, in no set order, and the
    ffi.gc() object that freed it before had one (an unclosed socket's
    __del__ then closed freed memory; the process test is
    tests/test_robust_close.py::test_unclosed_sockets_in_a_reference_cycle)."""
    h = _lowlevel.new()
    assert not gc.is_tracked(h.ptr)
    assert not gc.is_tracked(h._owner)
    assert not hasattr(type(h._owner), "__del__")
    assert _lowlevel.close(h) == 0
