"""A trio client, as trio's and anyio's documentation show: 200 round trips
and a 4 MiB echo (sent and received at once, sha256) over
``trio.open_tcp_stream``, 20 new connections, one made with the low-level
``trio.socket`` API, and 20 through anyio (``connect_tcp``) on trio; prints each
round trip's latency (``LATENCIES`` and a JSON object: seconds per kind) and OK."""

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator

import anyio
import trio
import trio.socket

BIG = hashlib.sha256(b"trio").digest() * (4 * 1024 * 1024 // 32)

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


async def receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        assert chunk, f"EOF after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


async def main(port: int) -> None:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        for i in range(200):
            msg = b"ping %d" % i
            with timed("round_trip"):
                await stream.send_all(msg)
                assert await receive_exactly(stream, len(msg)) == msg
        got = {}

        async def receive() -> None:
            got["echo"] = await receive_exactly(stream, len(BIG))

        with timed("echo_4mib"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.send_all, BIG)
                nursery.start_soon(receive)
        assert hashlib.sha256(got["echo"]).digest() == hashlib.sha256(BIG).digest()
    for i in range(20):
        with timed("newconn"):
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await stream.send_all(b"new %d" % i)
                assert await receive_exactly(stream, len(b"new %d" % i)) == b"new %d" % i
    with timed("low_level"), trio.socket.socket() as sock:
        await sock.connect(("127.0.0.1", port))
        await sock.send(b"low level")
        assert await sock.recv(100) == b"low level"


async def with_anyio(port: int) -> None:
    for i in range(20):
        with timed("anyio_newconn"):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"anyio %d" % i)
                assert await stream.receive() == b"anyio %d" % i


trio.run(main, int(sys.argv[1]))
anyio.run(with_anyio, int(sys.argv[1]), backend="trio")
print("LATENCIES", json.dumps(LATENCIES))
print("OK")
