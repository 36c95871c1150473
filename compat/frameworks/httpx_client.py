"""httpx, as its documentation shows: a keep-alive Client and one-off calls
against an ASGI app under uvicorn, 1 MiB bodies both ways; prints each request's
latency (``LATENCIES`` and a JSON object: seconds per kind of request) and OK."""

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator

import httpx

BIG = bytes(range(256)) * 4096

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


base = f"http://127.0.0.1:{sys.argv[1]}"
with httpx.Client() as client:
    for _ in range(100):
        with timed("keepalive"):
            assert client.get(f"{base}/small").content == b"hello"
    for _ in range(5):
        with timed("get_1mib"):
            assert client.get(f"{base}/big").content == BIG
        with timed("post_1mib"):
            assert client.post(f"{base}/echo", content=BIG).text == hashlib.sha256(BIG).hexdigest()
for _ in range(10):
    with timed("oneoff"):
        assert httpx.get(f"{base}/small").content == b"hello"
print("LATENCIES", json.dumps(LATENCIES))
print("OK")
