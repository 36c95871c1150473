"""A blocking ``socket`` client, as the ``socket`` module's documentation shows (no rsock
import), against ``selectors_server.py``.

``socket_client.py PORT MODE SECONDS WARMUP``; MODE: rtt (64-byte messages, each echoed
before the next is sent) or newconn (a new connection per message:
``socket.create_connection``, one round trip, close).  Runs WARMUP seconds, then SECONDS
seconds, and prints one JSON line: round trips, bytes sent, elapsed, and each one's
latency (in order)."""

import json
import resource
import socket
import sys
import time
from collections.abc import Callable

MSG = b"x" * 64


def round_trip(s: socket.socket) -> None:
    s.sendall(MSG)
    got = b""
    while len(got) < len(MSG):
        chunk = s.recv(len(MSG) - len(got))
        assert chunk, "EOF"
        got += chunk
    assert got == MSG


def timed(step: Callable[[], None], seconds: float) -> dict[str, object]:
    count = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    while True:
        step()
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


def main(port: int, mode: str, seconds: float, warmup: float) -> None:
    assert mode in ("rtt", "newconn"), mode
    if mode == "newconn":

        def step() -> None:
            with socket.create_connection(("127.0.0.1", port)) as s:
                round_trip(s)

        timed(step, warmup)
        print(json.dumps(timed(step, seconds)), flush=True)
        return
    with socket.create_connection(("127.0.0.1", port)) as s:
        timed(lambda: round_trip(s), warmup)
        print(json.dumps(timed(lambda: round_trip(s), seconds)), flush=True)


main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
