"""A trio client, as trio's and anyio's documentation show: 200 round trips
and a 4 MiB echo (sent and received at once, sha256) over
``trio.open_tcp_stream``, 20 new connections, one made with the low-level
``trio.socket`` API, and 20 through anyio (``connect_tcp``) on trio; prints OK."""

import hashlib
import sys

import anyio
import trio
import trio.socket

BIG = hashlib.sha256(b"trio").digest() * (4 * 1024 * 1024 // 32)


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
            await stream.send_all(msg)
            assert await receive_exactly(stream, len(msg)) == msg
        got = {}

        async def receive() -> None:
            got["echo"] = await receive_exactly(stream, len(BIG))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, BIG)
            nursery.start_soon(receive)
        assert hashlib.sha256(got["echo"]).digest() == hashlib.sha256(BIG).digest()
    for i in range(20):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"new %d" % i)
            assert await receive_exactly(stream, len(b"new %d" % i)) == b"new %d" % i
    with trio.socket.socket() as sock:
        await sock.connect(("127.0.0.1", port))
        await sock.send(b"low level")
        assert await sock.recv(100) == b"low level"


async def with_anyio(port: int) -> None:
    for i in range(20):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"anyio %d" % i)
            assert await stream.receive() == b"anyio %d" % i


trio.run(main, int(sys.argv[1]))
anyio.run(with_anyio, int(sys.argv[1]), backend="trio")
print("OK")
