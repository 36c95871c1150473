"""requests, as its documentation shows (no rsock import), against ``http_server.py``.

``requests_client.py PORT MODE SECONDS WARMUP``; MODE: keepalive (GET /small on a
``requests.Session``), newconn (``requests.get`` of /small: a new connection per
request) or big (GET /big, 1 MiB, on a Session).  Runs WARMUP seconds, then SECONDS
seconds, and prints one JSON line: requests, body bytes, elapsed, and each one's latency
(in order)."""

import json
import resource
import sys
import time
from collections.abc import Callable

import requests

BIG = bytes(range(256)) * 4096


def loop(
    get: Callable[[str], requests.Response], url: str, want: bytes, seconds: float
) -> dict[str, object]:
    count = nbytes = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    while True:
        body = get(url).content
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
    assert mode in ("keepalive", "newconn", "big"), mode
    path, want = ("/big", BIG) if mode == "big" else ("/small", b"hello")
    url = f"http://127.0.0.1:{port}{path}"
    with requests.Session() as session:
        get = requests.get if mode == "newconn" else session.get
        loop(get, url, want, warmup)
        result = loop(get, url, want, seconds)
    print(json.dumps(result), flush=True)


main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
