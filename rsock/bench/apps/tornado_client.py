"""tornado, as its documentation shows: TCPClient and IOStream line round trips (no
rsock import).

``tornado_client.py PORT MODE SECONDS WARMUP``; MODE: rtt (64-byte lines, each echoed
before the next is sent) or newconn (a new connection per line: connect, one round
trip, close).  Runs WARMUP seconds, then SECONDS seconds, and prints one JSON line: round
trips, bytes sent, elapsed, and each one's latency (in order)."""

import asyncio
import json
import resource
import sys
import time

import tornado.iostream
import tornado.tcpclient

LINE = b"x" * 63 + b"\n"  # 64 bytes


async def loop(stream: tornado.iostream.IOStream, seconds: float) -> dict[str, object]:
    count = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    while True:
        await stream.write(LINE)
        assert await stream.read_until(b"\n") == LINE
        count += 1
        now = time.perf_counter()
        latencies.append(now - last)
        last = now
        elapsed = now - start
        if elapsed >= seconds:
            return {
                "count": count,
                "bytes": count * len(LINE),
                "elapsed": elapsed,
                "rusage": [*cpu[:2], *resource.getrusage(resource.RUSAGE_SELF)[:2]],
                "latencies": [round(x, 7) for x in latencies],
            }


async def newconn(
    client: tornado.tcpclient.TCPClient, port: int, seconds: float
) -> dict[str, object]:
    count = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    while True:
        stream = await client.connect("127.0.0.1", port)
        await stream.write(LINE)
        assert await stream.read_until(b"\n") == LINE
        stream.close()
        count += 1
        now = time.perf_counter()
        latencies.append(now - last)
        last = now
        elapsed = now - start
        if elapsed >= seconds:
            return {
                "count": count,
                "bytes": count * len(LINE),
                "elapsed": elapsed,
                "rusage": [*cpu[:2], *resource.getrusage(resource.RUSAGE_SELF)[:2]],
                "latencies": [round(x, 7) for x in latencies],
            }


async def main(port: int, mode: str, seconds: float, warmup: float) -> None:
    assert mode in ("rtt", "newconn"), mode
    if mode == "newconn":
        client = tornado.tcpclient.TCPClient()
        await newconn(client, port, warmup)
        print(json.dumps(await newconn(client, port, seconds)), flush=True)
        return
    stream = await tornado.tcpclient.TCPClient().connect("127.0.0.1", port)
    await loop(stream, warmup)
    result = await loop(stream, seconds)
    stream.close()
    print(json.dumps(result), flush=True)


asyncio.run(main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
