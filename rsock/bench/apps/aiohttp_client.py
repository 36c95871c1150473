"""An aiohttp client written as aiohttp's documentation shows (no rsock import).

``aiohttp_client.py PORT MODE SECONDS WARMUP``; MODE: keepalive (GET /small on one
session), newconn (GET /small, a new connection per request), big (GET /big, 1 MiB),
stream (GET /stream, a 64 MiB body read in chunks), file (GET /file, a 32 MiB file
read in chunks).  Runs WARMUP seconds, then SECONDS seconds, and prints one JSON line:
requests, body bytes, elapsed, and each one's latency (in order)."""

import asyncio
import json
import resource
import sys
import time

import aiohttp

BIG = bytes(range(256)) * 4096
TWICE = BIG * 2
STREAM_MB = 64
FILE_MB = 32


async def one(session: aiohttp.ClientSession, base: str, mode: str) -> int:
    if mode in ("keepalive", "newconn"):
        async with session.get(f"{base}/small") as r:
            body = await r.read()
            assert body == b"hello", body
    elif mode == "big":
        async with session.get(f"{base}/big") as r:
            body = await r.read()
            assert body == BIG
    elif mode == "file":
        n = 0
        async with session.get(f"{base}/file") as r:
            async for chunk in r.content.iter_chunked(1 << 20):
                k = n % len(BIG)  # the file is BIG over and over: check each chunk's start
                head = chunk[:64]
                assert head == TWICE[k : k + len(head)], n
                n += len(chunk)
        assert n == FILE_MB << 20, n
        return n
    else:
        n = 0
        async with session.get(f"{base}/stream", params={"mb": str(STREAM_MB)}) as r:
            async for chunk in r.content.iter_chunked(1 << 20):
                n += len(chunk)
        assert n == STREAM_MB << 20, n
        return n
    return len(body)


async def loop(
    session: aiohttp.ClientSession, base: str, mode: str, seconds: float
) -> dict[str, object]:
    count = nbytes = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    while True:
        nbytes += await one(session, base, mode)
        count += 1
        now = time.perf_counter()
        latencies.append(now - last)
        last = now
        elapsed = now - start
        if elapsed >= seconds:
            return {
                "count": count,
                "bytes": nbytes,
                "elapsed": elapsed,
                "rusage": [*cpu[:2], *resource.getrusage(resource.RUSAGE_SELF)[:2]],
                "latencies": [round(x, 7) for x in latencies],
            }


async def main(port: int, mode: str, seconds: float, warmup: float) -> None:
    base = f"http://127.0.0.1:{port}"
    connector = aiohttp.TCPConnector(force_close=mode == "newconn")
    async with aiohttp.ClientSession(connector=connector) as session:
        await loop(session, base, mode, warmup)
        result = await loop(session, base, mode, seconds)
    print(json.dumps(result), flush=True)


asyncio.run(main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
