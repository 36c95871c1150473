"""requests, as its documentation shows: a Session (keep-alive) and one-off
calls, 1 MiB bodies both ways, checked; prints each request's latency (``LATENCIES``
and a JSON object: seconds per kind of request) and OK."""

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator

import requests

BIG = bytes(range(256)) * 4096

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


base = f"http://127.0.0.1:{sys.argv[1]}"
with requests.Session() as s:
    for _ in range(10):
        with timed("get"):
            assert s.get(f"{base}/").content == BIG
        with timed("post"):
            assert s.post(f"{base}/", data=BIG).text == hashlib.sha256(BIG).hexdigest()
for _ in range(5):
    with timed("oneoff"):
        assert requests.get(f"{base}/").content == BIG
print("LATENCIES", json.dumps(LATENCIES))
print("OK")
