"""trio, as its tutorial shows: ``trio.open_tcp_stream`` round trips (no rsock
import).

``trio_client.py PORT MODE SECONDS WARMUP``; MODE: rtt (64-byte messages, each
echoed before the next is sent) or newconn (a new connection per message:
connect, one round trip, close).  Runs WARMUP seconds, then SECONDS seconds, and prints
one JSON line: round trips, bytes sent, elapsed, and each one's latency (in order)."""

import functools
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable

import trio

MSG = b"x" * 64


async def receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        assert chunk, "EOF"
        buf += chunk
    return buf


async def timed(step: Callable[[], Awaitable[None]], seconds: float) -> dict[str, object]:
    """Runs ``step`` (one round trip) for ``seconds``: round trips, bytes, elapsed."""
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
                "bytes": count * len(MSG),
                "elapsed": elapsed,
                "rusage": [*cpu[:2], *resource.getrusage(resource.RUSAGE_SELF)[:2]],
                "latencies": [round(x, 7) for x in latencies],
            }


async def round_trip(stream: trio.SocketStream) -> None:
    await stream.send_all(MSG)
    assert await receive_exactly(stream, len(MSG)) == MSG


async def newconn(port: int) -> None:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await round_trip(stream)


async def main(port: int, mode: str, seconds: float, warmup: float) -> None:
    assert mode in ("rtt", "newconn"), mode
    if mode == "newconn":
        step = functools.partial(newconn, port)
        await timed(step, warmup)
        print(json.dumps(await timed(step, seconds)), flush=True)
        return
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        step = functools.partial(round_trip, stream)
        await timed(step, warmup)
        print(json.dumps(await timed(step, seconds)), flush=True)


trio.run(main, int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
