"""A websockets client, as its documentation shows (no rsock import).

``websockets_client.py PORT MODE SECONDS WARMUP``; MODE: small (64-byte binary
messages), big (1 MiB) or bigraw (1 MiB, per-message compression off: ``compression=None``
on both sides, as websockets' documentation says to do for data that does not compress;
the server runs with ``raw`` then), each echoed by the server before the next is sent, or newconn
(a new connection per 64-byte message: opening handshake, one echo, closing handshake).  Runs
WARMUP seconds, then SECONDS seconds, and prints one JSON line: messages, bytes
(one direction), elapsed, and each one's latency (in order)."""

import asyncio
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable

from websockets.asyncio.client import ClientConnection, connect

BIG = bytes(range(256)) * 4096


async def timed(
    step: Callable[[], Awaitable[None]], size: int, seconds: float
) -> dict[str, object]:
    """Runs step (one echoed message of size bytes) for seconds."""
    count = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    while True:
        await step()
        count += 1
        now = time.perf_counter()
        latencies.append(now - last)
        last = now
        elapsed = now - start
        if elapsed >= seconds:
            return {
                "count": count,
                "bytes": count * size,
                "elapsed": elapsed,
                "rusage": [*cpu[:2], *resource.getrusage(resource.RUSAGE_SELF)[:2]],
                "latencies": [round(x, 7) for x in latencies],
            }


async def echo(ws: ClientConnection, message: bytes) -> None:
    await ws.send(message)
    assert await ws.recv() == message


async def loop(ws: ClientConnection, message: bytes, seconds: float) -> dict[str, object]:
    return await timed(lambda: echo(ws, message), len(message), seconds)


async def newconn(port: int, message: bytes, seconds: float) -> dict[str, object]:
    async def step() -> None:
        async with connect(f"ws://127.0.0.1:{port}") as ws:
            await echo(ws, message)

    return await timed(step, len(message), seconds)


async def main(port: int, mode: str, seconds: float, warmup: float) -> None:
    if mode == "newconn":
        await newconn(port, BIG[:64], warmup)
        print(json.dumps(await newconn(port, BIG[:64], seconds)), flush=True)
        return
    message = BIG[:64] if mode == "small" else BIG
    compression = None if mode == "bigraw" else "deflate"
    url = f"ws://127.0.0.1:{port}"
    async with connect(url, max_size=4 * 1024 * 1024, compression=compression) as ws:
        await loop(ws, message, warmup)
        result = await loop(ws, message, seconds)
    print(json.dumps(result), flush=True)


asyncio.run(main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
