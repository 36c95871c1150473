"""An aiohttp client written as aiohttp's documentation shows (no rsock import):
keep-alive small requests, 1 MiB bodies both ways, a large streamed body,
each checked; prints OK."""

import asyncio
import hashlib
import sys

import aiohttp

BIG = bytes(range(256)) * 4096


async def main(port: int, stream_mb: int) -> None:
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            async with session.get(f"{base}/small") as r:
                assert await r.text() == "hello"
        for _ in range(5):
            async with session.get(f"{base}/big") as r:
                assert await r.read() == BIG
            async with session.post(f"{base}/echo", data=BIG) as r:
                assert await r.text() == hashlib.sha256(BIG).hexdigest()
        h = hashlib.sha256()
        async with session.get(f"{base}/stream", params={"mb": str(stream_mb)}) as r:
            async for chunk in r.content.iter_chunked(1 << 20):
                h.update(chunk)
        want = hashlib.sha256(BIG[: 256 * 1024] * (stream_mb * 4)).hexdigest()
        assert h.hexdigest() == want
    # a new connection per request, too
    for _ in range(20):
        async with aiohttp.ClientSession() as session, session.get(f"{base}/small") as r:
            assert await r.text() == "hello"
    print("OK")


asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 64))
