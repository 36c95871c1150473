"""A websockets client, as its documentation shows: small messages and 1 MiB
messages echoed and checked; prints each message's latency (``LATENCIES`` and a JSON
object: seconds per kind of message) and OK."""

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator

from websockets.asyncio.client import connect

BIG = bytes(range(256)) * 4096

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


async def main(port: int) -> None:
    async with connect(f"ws://127.0.0.1:{port}", max_size=4 * 1024 * 1024) as ws:
        for i in range(500):
            with timed("small"):
                await ws.send(f"m{i}")
                assert await ws.recv() == f"m{i}"
        for _ in range(5):
            with timed("1mib"):
                await ws.send(BIG)
                assert await ws.recv() == BIG
    print("LATENCIES", json.dumps(LATENCIES))
    print("OK")


asyncio.run(main(int(sys.argv[1])))
