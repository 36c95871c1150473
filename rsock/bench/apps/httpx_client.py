"""httpx, as its documentation shows: a keep-alive ``httpx.Client`` against an ASGI app
under uvicorn (no rsock import).

``httpx_client.py PORT MODE SECONDS WARMUP``; MODE: keepalive (GET /small), newconn
(GET /small on a client that keeps no connection alive: a new connection per request)
or big (GET /big, 1 MiB).  Runs WARMUP seconds, then SECONDS seconds, and prints one JSON
line: requests, body bytes, elapsed, and each one's latency (in order)."""

import json
import resource
import sys
import time

import httpx

BIG = bytes(range(256)) * 4096


def loop(client: httpx.Client, url: str, want: bytes, seconds: float) -> dict[str, object]:
    count = nbytes = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    while True:
        body = client.get(url).content
        assert body == want, len(body)
        count += 1
        nbytes += len(body)
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


def main(port: int, mode: str, seconds: float, warmup: float) -> None:
    path, want = ("/big", BIG) if mode == "big" else ("/small", b"hello")
    url = f"http://127.0.0.1:{port}{path}"
    limits = httpx.Limits(max_keepalive_connections=0 if mode == "newconn" else 20)
    with httpx.Client(limits=limits) as client:
        loop(client, url, want, warmup)
        result = loop(client, url, want, seconds)
    print(json.dumps(result), flush=True)


main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
