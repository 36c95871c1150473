"""An aiohttp client written as aiohttp's documentation shows (no rsock import):
keep-alive small requests, 1 MiB bodies both ways, a large streamed body,
each checked; prints each request's latency (``LATENCIES`` and a JSON object: seconds
per kind of request) and OK."""

import asyncio
import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator

import aiohttp

BIG = bytes(range(256)) * 4096

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


async def main(port: int, stream_mb: int) -> None:
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            with timed("keepalive"):
                async with session.get(f"{base}/small") as r:
                    assert await r.text() == "hello"
        for _ in range(5):
            with timed("get_1mib"):
                async with session.get(f"{base}/big") as r:
                    assert await r.read() == BIG
            with timed("post_1mib"):
                async with session.post(f"{base}/echo", data=BIG) as r:
                    assert await r.text() == hashlib.sha256(BIG).hexdigest()
        h = hashlib.sha256()
        with timed("stream"):
            async with session.get(f"{base}/stream", params={"mb": str(stream_mb)}) as r:
                async for chunk in r.content.iter_chunked(1 << 20):
                    h.update(chunk)
        want = hashlib.sha256(BIG[: 256 * 1024] * (stream_mb * 4)).hexdigest()
        assert h.hexdigest() == want
    # a new connection per request, too
    for _ in range(20):
        with timed("newconn"):
            async with aiohttp.ClientSession() as session, session.get(f"{base}/small") as r:
                assert await r.text() == "hello"
    print("LATENCIES", json.dumps(LATENCIES))
    print("OK")


asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 64))
