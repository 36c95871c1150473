"""Issue 18.1's measurement: a plain asyncio Protocol that receives 1 MiB replies
(appending the chunks, then joining them, as aiohttp's client does), over stdlib
asyncio TCP and over rsock.asyncio, in one process; MB/s and minor page faults
per MiB (the receiver's heap churn), and the chunk sizes data_received got.

    python tests/measure_asyncio_replies.py tcp
    RSOCK_FALLBACK=never python tests/measure_asyncio_replies.py rsock
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import sys
import time
from typing import Any

import rsock.asyncio as rsock_asyncio

N = 200
SIZE = 1 << 20
PAYLOAD = b"x" * SIZE


class Server(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for _ in data:  # one reply per request byte
            self.transport.write(PAYLOAD)


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.got = 0
        self.sizes: list[int] = []
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.got += len(data)
        self.sizes.append(len(data))
        if self.got >= SIZE:
            body = b"".join(self.chunks)
            assert len(body) == SIZE
            self.chunks, self.got = [], 0
            assert self.done is not None
            self.done.set_result(None)


async def measure(mode: str, n: int = N) -> dict[str, float]:
    """n 1 MiB replies (after 10 to warm up) over ``tcp`` (the loop's own
    transports) or ``rsock`` (rsock.asyncio): MB/s, minor page faults per
    MiB of this process, data_received calls per MiB, median chunk."""
    loop = asyncio.get_running_loop()
    api: Any = rsock_asyncio if mode == "rsock" else loop
    server = await api.create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, client = await api.create_connection(Client, "127.0.0.1", port)
    faults0, t0 = 0, 0.0
    for i in range(n + 10):  # 10 to warm up
        if i == 10:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
        client.done = loop.create_future()
        transport.write(b"r")
        await client.done
    dt = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    transport.close()
    server.close()
    await server.wait_closed()
    return {
        "mbps": n * SIZE / dt / 1e6,
        "faults_per_mib": faults / n,
        "reads_per_mib": len(client.sizes) / (n + 10),
        "median_chunk": float(statistics.median(client.sizes)),
    }


async def main(mode: str) -> None:
    r = await measure(mode)
    print(
        f"{mode}: {r['mbps']:.0f} MB/s, minor faults per MiB {r['faults_per_mib']:.0f}, "
        f"data_received per MiB {r['reads_per_mib']:.1f}, "
        f"median chunk {r['median_chunk']:.0f} B"
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "rsock"))
